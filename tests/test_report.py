"""The first screen a user sees: ``print(embedl_dynamo.last_report())``, short and complete.

Every test here compiles in isolation (``compile_isolation``: a fresh Dynamo, no reports, the
built-in backends, a private cache) and seeds the weights it builds, so what it prints does not
depend on which tests ran before it in the same process.
"""

from __future__ import annotations

import gc
import re
import tempfile
import weakref

import expecttest
import pytest
import torch

import embedl_dynamo
from tests.models import ResNetLike, randomize_batchnorm

pytestmark = pytest.mark.usefixtures("compile_isolation")


def _normalised(text: str) -> str:
    """Timings vary from run to run; everything else is pinned."""
    return re.sub(r"\d+\.\d+ s\b", "<t> s", text)


class TestFirstScreen(expecttest.TestCase):
    def test_a_small_model_fits_on_one_screen(self) -> None:
        torch.manual_seed(0)
        model = randomize_batchnorm(ResNetLike().eval())
        with tempfile.TemporaryDirectory() as cache, torch.no_grad():  # a cold cache
            options = {"cache_dir": cache}
            torch.compile(model, backend="embedl_onnxruntime", options=options)(
                torch.randn(2, 3, 16, 16)
            )
        text = str(embedl_dynamo.last_report())
        assert len(text.splitlines()) <= 25
        self.assertExpectedInline(
            _normalised(text),
            """\
embedl_dynamo: 1 subgraph, 1 compiled (onnxruntime), 0 in PyTorch; compile <t> s
  subgraph 0: compiled on onnxruntime (backend onnxruntime, 37 ops, 13 rewrites, <t> s): auto: onnxruntime, timed fastest here (onnxruntime 1.00 ms, eager 4.00 ms)
rewrites: conv_bn_add_relu x4, conv_bn_relu x4, adaptive_avg_pool x1, conv x1, conv_bn x1, flatten_linear x1, +1 kinds
precision: fp32
full plan: print(report[i].plan)""",
        )

    def test_nothing_compiled_says_so(self) -> None:
        assert str(embedl_dynamo.last_report()) == "no subgraph compiled by an embedl_* backend yet"


def test_precision_mix_counts_layers_per_precision() -> None:
    from embedl_dynamo.report.compile_report import CompileReport
    from embedl_dynamo.report.subgraph import SubgraphReport

    sub = SubgraphReport(index=0, backend="tensorrt", runtime="onnxruntime", ops=3, status="ok")
    sub.pipeline = {
        "precision": "mixed",
        "quantized": True,
        "layers": [{"precision": "int8"}, {"precision": "int8"}, {"precision": "fp32"}],
    }
    assert CompileReport([sub]).precision_mix() == "mixed (2 int8, 1 fp32 layers)"
    sub.pipeline = {
        "precision": "int8",
        "quantized": True,
        "quantization": {"quantized_layers": ["a", "b"], "float_layers": [{"id": "c"}]},
    }
    assert CompileReport([sub]).precision_mix() == "int8 (2 int8, 1 fp32 layers)"
    sub.pipeline = {"precision": "fp32"}
    assert CompileReport([sub]).precision_mix() == "fp32"


@pytest.mark.parametrize(("int8_ms", "said"), [(13.4, True), (10.0, False), (5.0, False)])
def test_the_first_screen_says_when_int8_is_slower_than_float(int8_ms, said) -> None:
    from embedl_dynamo.report.compile_report import CompileReport
    from embedl_dynamo.report.subgraph import SubgraphReport

    sub = SubgraphReport(index=0, backend="tensorrt", runtime="onnxruntime", ops=3, status="ok")
    sub.pipeline = {
        "precision": "int8",
        "quantized": True,
        "int8_speed": {"runtime": "onnxruntime", "int8_ms": int8_ms, "fp32_ms": 10.0},
    }
    second = CompileReport([sub]).summary().splitlines()[1]
    assert second.startswith("warning: subgraph 0: int8 is 1.34x slower") == said
    if said:
        assert "on onnxruntime (13.40 ms against 10.00 ms)" in second and "'mixed'" in second


def _big_tensors() -> list[torch.Tensor]:
    """Tensors of a million elements or more that Python can still reach (fake ones too: they
    stand for a graph Dynamo traced, which nothing should keep once it is reset)."""
    tensors = (o for o in gc.get_objects() if issubclass(type(o), torch.Tensor))
    return [t for t in tensors if t.numel() >= 2**20]


def test_a_report_keeps_the_plan_not_the_model() -> None:
    """A report holds names and rows: once the model is dropped its weights are freed, while
    ``last_report()`` still prints the plan."""
    assert not _big_tensors(), "a big tensor is alive before the test: not an isolated check"
    layers = [torch.nn.Linear(1024, 1024) for _ in range(5)]  # 20 MB of weights
    model = torch.nn.Sequential(*(m for lin in layers for m in (lin, torch.nn.ReLU()))).eval()
    weight = weakref.ref(layers[0].weight)
    with torch.no_grad():
        torch.compile(model, backend="embedl_onnxruntime")(torch.randn(2, 1024))
    embedl_dynamo.wait_for_cache_writes()  # the file is written on a helper thread, from memory
    del layers, model
    torch._dynamo.reset()
    gc.collect()
    assert weight() is None, "the compiled model's weights stay alive"
    assert not _big_tensors(), "a copy of the weights stays alive (the frozen graph?)"
    report = embedl_dynamo.last_report()
    assert "linear_relu@0" in str(report[0].plan)
    assert "subgraph 0: compiled" in str(report)


class _Broken(torch.nn.Module):
    """Two Linear+ReLU blocks with a graph break between them: two subgraphs in one compile."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        self.b = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        torch._dynamo.graph_break()
        return self.b(x)


def test_recompiles_of_one_callable_stay_in_its_report_from_any_call_site() -> None:
    """A later call that compiles again (here a new batch size, from a deeper call site) adds
    to its callable's report. The record used to follow the call's frame object: a later
    call's recompile joined the report only when its frame happened to reuse the first one's
    address (``tests/graph/test_scalar_inputs.py`` failed about once in five suite runs)."""
    options = {"min_subgraph_size": 1}
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime", options=options)

    def nested(depth: int, x: torch.Tensor) -> torch.Tensor:
        return compiled(x) if depth == 0 else nested(depth - 1, x)

    with torch.no_grad():
        compiled(torch.randn(2, 8))
        nested(5, torch.randn(3, 8))  # a new batch size: Dynamo compiles again
    assert [s.index for s in embedl_dynamo.last_report()] == [0, 1]


def test_the_last_report_holds_the_last_compile_only() -> None:
    """A compiled callable's report holds its first call's subgraphs; the next compiled
    callable's first call starts a new report, its subgraphs numbered from 0."""
    options = {"min_subgraph_size": 1}
    with torch.no_grad():
        first = torch.compile(_Broken().eval(), backend="embedl_onnxruntime", options=options)
        first(torch.randn(2, 8))
        assert [s.index for s in embedl_dynamo.last_report()] == [0, 1]
        first(torch.randn(2, 8))  # nothing compiles: the report stays
        assert len(embedl_dynamo.last_report()) == 2
        second = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
        torch.compile(second, backend="embedl_onnxruntime", options=options)(torch.randn(2, 8))
    report = embedl_dynamo.last_report()
    assert [(s.index, s.status) for s in report] == [(0, "compiled")]
    assert [e.id for e in report[0].plan.entries if e.apply] == ["linear_relu@0"]
