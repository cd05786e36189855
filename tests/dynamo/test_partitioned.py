"""A Dynamo graph partitioned by capability, end to end (:mod:`embedl_dynamo.dynamo.partitioned`):
the op no runtime computes exactly stays in PyTorch and the rest runs on the runtime, at every
precision, with dynamic sizes, and behind the per-call guards
(:mod:`embedl_dynamo.dynamo.call_guards`)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.dynamo import partitioned
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.helpers import assert_close_to_scale

RUNTIMES = [
    "onnxruntime",
    pytest.param(
        "openvino",
        marks=pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino"),
    ),
]


class _CoshNet(nn.Module):
    """Conv, BatchNorm, ReLU; ``cosh`` (no conformance row); conv, ReLU, pooling, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.cosh(y * 0.1)
        y = torch.relu(self.conv2(y))
        return self.head(y.mean((2, 3)))


def _compile(model: nn.Module, runtime: str, **options):
    backend = f"embedl_{runtime}"
    return torch.compile(model, backend=backend, options={"runtime": runtime, **options})


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_only_the_op_without_a_row_stays_in_pytorch(runtime):
    model = _CoshNet().eval()
    x = torch.randn(2, 3, 12, 12)
    with warnings.catch_warnings(record=True) as caught, torch.inference_mode():
        warnings.simplefilter("always")
        y = _compile(model, runtime)(x)
    assert_close_to_scale(y, model(x), rtol=1e-5)
    (sub,) = embedl_dynamo.last_report()
    assert (sub.status, sub.runtime) == ("partitioned", runtime)
    assert [k["op"] for k in sub.kept] == ["cosh"]
    assert [(p.runtime, p.status) for p in sub.partitions] == [(runtime, "compiled")] * 2
    assert sub.coverage["ops_on_runtime"] == sub.coverage["ops"] - 1
    assert sub.coverage["flops_on_runtime"] == sub.coverage["flops"] > 0  # cosh counts none
    assert sum("cosh" in str(w.message) for w in caught) == 1  # one warning names it
    assert "fragment 0" in str(sub.partitions[0]) and "cosh" in str(sub)


def test_dynamic_sizes_reach_every_fragment_without_another_build():
    model = _CoshNet().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime", dynamic=True)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in (2, 5, 3, 4):
            x = torch.randn(batch, 3, 10 + batch, 12)
            assert_close_to_scale(compiled(x), model(x), rtol=1e-5)
    reports = embedl_dynamo.last_report().subgraphs  # Dynamo's first graph, then a dynamic one
    assert len(reports) == 2 and all(len(r.partitions) == 2 for r in reports), reports


def test_int8_quantizes_each_fragment_on_data_fed_through_the_whole_graph():
    torch.manual_seed(0)
    model = _CoshNet().eval()
    data = [torch.randn(4, 3, 12, 12) for _ in range(4)]
    options = {"precision": "int8", "calibration_data": data, "accuracy_budget": 0.9}
    x = torch.randn(4, 3, 12, 12)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = _compile(model, "onnxruntime", **options)(x)
    assert_close_to_scale(y, model(x), rtol=0.1)
    (sub,) = embedl_dynamo.last_report()
    assert sub.status == "partitioned"
    assert all(p.pipeline.get("quantized") for p in sub.partitions), sub.partitions


@pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino")
def test_a_nan_input_to_a_fragment_openvino_computes_otherwise_runs_in_pytorch():
    """OpenVINO's ReLU gives 0 for NaN and its convolution spreads NaN otherwise: the table
    lists both as differences, so such a call runs in PyTorch, which keeps NaN where eager
    does; finite calls stay on OpenVINO."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    poisoned = x.clone()
    poisoned[0, 0, 3, 3] = float("nan")
    compiled = _compile(model, "openvino")
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close_to_scale(compiled(x), model(x), rtol=1e-5)
        out, expected = compiled(poisoned), model(poisoned)
    assert torch.equal(out.isnan(), expected.isnan()) and expected.isnan().any()
    (sub,) = embedl_dynamo.last_report()
    assert sub.runtime == "openvino" and "NaN or infinity" in sub.reason


def test_an_fp16_overflow_runs_in_pytorch():
    """fp16 ends at 65504: an activation past it is inf in the fp16 artifact and finite in
    PyTorch's float graph, so such a call is answered by PyTorch; ordinary calls stay fp16."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(8, 8)
            self.down = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))

    model = Scaled().eval()
    with torch.no_grad():
        model.up.weight.mul_(100.0)  # activations past 65504 on the large input below
    compiled = _compile(model, "onnxruntime", precision="fp16", accuracy_budget=0.9)
    small, large = torch.randn(2, 8), torch.randn(2, 8) * 1e3
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close_to_scale(compiled(small), model(small), rtol=0.05)
        out = compiled(large)
    assert torch.isfinite(model(large)).all() and torch.isfinite(out).all()
    assert model.up(large).abs().max() > 65504  # past fp16's range
    assert torch.allclose(out, model(large), rtol=1e-5)


@pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino")
def test_onnx_runtime_takes_the_integer_ops_openvino_keeps():
    """OpenVINO computes int64 as int32, so its table keeps an int64 product in PyTorch; under
    ``runtime="auto"`` ONNX Runtime, which multiplies int64 exactly, takes that fragment
    instead, and nothing stays in PyTorch."""

    def fn(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x * 2.0 + 1.0), ids * 1_000_003

    compiled = torch.compile(fn, backend="embedl_openvino", options={"min_subgraph_size": 1})
    x, ids = torch.randn(4), torch.tensor([3, 2**40, -(2**35), 0])
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y, k = compiled(x, ids)
    assert torch.equal(y, fn(x, ids)[0]) and torch.equal(k, fn(x, ids)[1])
    (sub,) = embedl_dynamo.last_report()
    assert sorted(p.runtime for p in sub.partitions) == ["onnxruntime", "openvino"], sub
    assert sub.kept == [] and sub.runtime == "onnxruntime+openvino"


class _WriteBesideCosh(nn.Module):
    """A tensor read before and after an in-place write (``setitem``), with ``cosh`` (no row)
    among its readers: the write orders the reads, which no data flow shows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x) * 2.0
        before = y.sin()
        y[:, 0] = 1.0
        return torch.cosh(y).sum(1) + before.sum(1) + (y * 3.0).sum(1)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_in_place_write_stays_in_order_with_every_reader_of_its_tensor(runtime):
    model = _WriteBesideCosh()
    compiled = _compile(model, runtime, min_subgraph_size=1, beat_eager=False)
    for seed in range(3):  # the first call builds, the later ones run what was built
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    (sub,) = embedl_dynamo.last_report()
    assert sub.status == "partitioned"
    kept = {k["op"]: k["reason"] for k in sub.kept}
    # the tensor's readers stay with the write, in PyTorch; its producer stays on the runtime
    assert set(kept) == {"sin", "cosh", "mul"} and "an in-place write" in kept["sin"]
    assert "no conformance row" in kept["cosh"]


class _ZeroedBesideCosh(nn.Module):
    """``zero_`` (no out-of-place form: it stays a write) on a tensor read before it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x) * 2.0
        before = torch.cosh(y)
        y.zero_()
        return before.sum(1) + (y + 1.0).sum(1) + y.sin().sum(1)


def _partitioned_as_eager(model: nn.Module, runtime: str, calls: int = 2):
    """The subgraph's report after ``calls`` calls of ``model`` compiled with every fragment
    kept (``min_subgraph_size=1``), each equal to eager (the first call builds)."""
    compiled = _compile(model, runtime, min_subgraph_size=1, beat_eager=False)
    for seed in range(calls):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    (sub,) = embedl_dynamo.last_report()
    return sub


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_write_without_an_out_of_place_form_stays_in_order_too(runtime):
    sub = _partitioned_as_eager(_ZeroedBesideCosh(), runtime)
    kept = {k["op"]: k["reason"] for k in sub.kept}
    assert "an in-place write" in kept["zero_"] and "no conformance row" in kept["cosh"]


class _WriteWaitingForALaterFragment(nn.Module):
    """A write whose value comes from a fragment that also waits for a PyTorch op placed
    after the tensor's next reader: data flow alone runs that reader before the write
    (Longformer's masked diagonals gave answers 0.08 off so)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(x * 2.0) * 3.0
        before = torch.cosh(y * 0.1)  # a reader before the write: the write stays in PyTorch
        value = torch.sigmoid(before) * 2.0 + 1.0  # in the fragment that waits for tail
        y[:, 0] = value[:, 0]
        after = torch.cosh(y * 0.1)
        tail = torch.cosh(x)
        return after, torch.sigmoid(tail) * value + 1.0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_write_runs_before_the_readers_after_it_whatever_it_waits_for(runtime):
    sub = _partitioned_as_eager(_WriteWaitingForALaterFragment(), runtime)
    assert sub.status == "partitioned" and len(sub.partitions) >= 2


def _stitched_off_by(amount: float):
    """``stitch`` whose graph answers ``amount`` off: a fault in putting the parts together,
    which no fragment's own check sees."""
    real = partitioned.stitch

    def stitch(graph, fragments, calls):
        stitched = real(graph, fragments, calls)
        return lambda *inputs: tuple(o + amount for o in stitched(*inputs))

    return stitch


def test_a_partitioned_graph_that_differs_from_pytorch_as_a_whole_runs_in_pytorch(monkeypatch):
    monkeypatch.setattr(partitioned, "stitch", _stitched_off_by(0.5))
    model, x = _CoshNet().eval(), torch.randn(2, 3, 12, 12)
    with pytest.warns(RuntimeWarning, match="partitioned: output 0 differs from PyTorch"):
        with torch.inference_mode():
            y = _compile(model, "onnxruntime")(x)
    assert torch.equal(y, model(x))
    (sub,) = embedl_dynamo.last_report()
    assert sub.status == "eager" and "differs from PyTorch" in sub.reason


def test_within_the_bound_the_partitioned_graph_runs(monkeypatch):
    monkeypatch.setattr(partitioned, "stitch", _stitched_off_by(1e-6))
    model, x = _CoshNet().eval(), torch.randn(2, 3, 12, 12)
    with torch.inference_mode():
        _compile(model, "onnxruntime")(x)
    (sub,) = embedl_dynamo.last_report()
    assert sub.status == "partitioned"


class _FragmentAcrossAWrite(nn.Module):
    """One fragment would compute both the value a write takes (before the write) and what
    reads a PyTorch op after it: the stitched graph orders the write between them, so the
    fragment is cut at the write."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(x * 2.0) * 3.0
        before = torch.cosh(y * 0.1)
        value = torch.sigmoid(x) * 2.0 + 1.0
        y[:, 0] = value[:, 0]
        after = torch.cosh(y * 0.1)
        return before, torch.sigmoid(after) * value + 1.0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_fragment_is_cut_where_a_write_in_pytorch_stands_among_its_nodes(runtime):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sub = _partitioned_as_eager(_FragmentAcrossAWrite(), runtime)
    assert not [w for w in caught if "failed inside embedl_dynamo" in str(w.message)]
    assert sub.status == "partitioned" and len(sub.partitions) >= 3
