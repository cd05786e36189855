"""``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` on the CPU runtimes: the rows of
:mod:`embedl_dynamo.runtimes.conformance.recurrent_rows`, checked here (``op_db`` has no entry
for them; ``test_conformance_modules.py`` runs ``module_db``'s samples too). Dynamo records
them only with ``torch._dynamo.config.allow_rnn`` set; without it no graph holds them."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo import last_report
from embedl_dynamo.runtimes.conformance import Verdict, op_name
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.helpers import runtime_compiled
from tests.runtimes.conformance_check import assert_conforms, compile_on, placement

NO_OPENVINO = pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino")
RUNTIMES = ("onnxruntime", pytest.param("openvino", marks=NO_OPENVINO))


@pytest.fixture
def allow_rnn():
    """Dynamo's ``allow_rnn`` set for the test, its old value restored after it."""
    old = torch._dynamo.config.allow_rnn
    torch._dynamo.config.allow_rnn = True
    yield
    torch._dynamo.config.allow_rnn = old


class _Tagger(nn.Module):
    """A bidirectional LSTM over a batch-first sequence, then a linear head (a CRNN's or a
    sequence tagger's)."""

    def __init__(self, **lstm: object) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True, bidirectional=True, **lstm)
        self.head = nn.Linear(self.lstm.proj_size * 2 or 32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


class _Layers(nn.Module):
    """The other forms, each reading the one before (two independent ones, one of them one
    way, stay in PyTorch on OpenVINO): two layers time-first with the initial states given,
    relu batch first, one direction without biases."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 10, num_layers=2)
        self.gru = nn.GRU(10, 10, num_layers=2, bidirectional=True)
        self.relu = nn.RNN(20, 10, nonlinearity="relu", batch_first=True, bidirectional=True)
        self.tanh = nn.RNN(20, 10, bias=False)

    def forward(self, x, h, c):
        y, (h1, c1) = self.lstm(x, (h[:2], c[:2]))
        z, h2 = self.gru(y, h)
        r, h3 = self.relu(z.transpose(0, 1))
        return h1, c1, h2, h3, self.tanh(r.transpose(0, 1), h[:1])


class _Beside(nn.Module):
    """Two layers side by side, neither reading the other, one of them one way only: OpenVINO
    merges the two ``relu(x)`` and computes one layer wrong."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 10)
        self.gru = nn.GRU(6, 10, bidirectional=True)

    def forward(self, x):
        return self.lstm(torch.relu(x))[0], self.gru(torch.relu(x))[0]


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g) for shape in ((5, 3, 6), (4, 3, 10), (4, 3, 10)))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_lstm_runs_on_the_runtime(allow_rnn, runtime):
    torch.manual_seed(0)
    model = _Tagger().eval()
    compiled = runtime_compiled(model, runtime)
    with torch.inference_mode():
        for seed in range(3):  # new values on each call
            x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(seed)) * (seed + 1)
            assert_conforms(model(x), compiled(x), Verdict.BOUNDED, f"call {seed} on {runtime}")
    (sub,) = last_report().subgraphs
    assert sub.status == "compiled" and sub.runtime == runtime, sub


@pytest.mark.parametrize(
    "runtime", ["onnxruntime", pytest.param("openvino", marks=(NO_OPENVINO, pytest.mark.slow))]
)
def test_gru_rnn_and_states_match_eager(allow_rnn, runtime):
    """Two layers, initial states given, batch first and not, relu and tanh, with and without
    biases: one graph, all of it on the runtime, within the bound over calls."""
    torch.manual_seed(0)
    model = _Layers().eval()
    compiled = compile_on(model, runtime, fallback="eager")
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(2):
            args = _inputs(seed)
            assert_conforms(model(*args), compiled(*args), Verdict.BOUNDED, runtime)
    ran, kept = placement(last_report().subgraphs, runtime)
    assert ran and not kept, kept


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_two_layers_side_by_side_stay_in_pytorch_on_openvino(allow_rnn, runtime):
    torch.manual_seed(0)
    model, x = _Beside().eval(), torch.randn(5, 3, 6)
    compiled = compile_on(model, runtime, fallback="eager")
    with torch.inference_mode():
        assert_conforms(model(x), compiled(x), Verdict.BOUNDED, runtime)
    ran, kept = placement(last_report().subgraphs, runtime)
    if runtime == "onnxruntime":
        assert ran and not kept, kept
    else:
        assert "(beside another) on torch.float32 stays in PyTorch on openvino" in kept[0], kept


def test_a_nan_input_runs_in_pytorch_where_the_runtime_differs(allow_rnn):
    """ONNX Runtime's LSTM gives numbers for a NaN input, PyTorch NaN (a listed difference):
    a call with a NaN goes to PyTorch, the others to the runtime."""
    torch.manual_seed(0)
    model = _Tagger().eval()
    compiled = runtime_compiled(model, "onnxruntime")
    with torch.inference_mode():
        x = torch.randn(2, 5, 8)
        compiled(x)
        x[1, 2, 3] = float("nan")
        out = compiled(x)
        assert_conforms(model(x), out, Verdict.BOUNDED, "a NaN input")
    assert torch.isnan(out[1]).all() and not torch.isnan(out[0]).any()


def test_without_allow_rnn_dynamo_compiles_nothing(tmp_path):
    """Dynamo's default leaves the layer out of its graph and skips the frame: no subgraph
    reaches a runtime, and the export says to set ``allow_rnn``."""
    model, x = _Tagger().eval(), torch.randn(2, 5, 8)
    assert torch._dynamo.config.allow_rnn is False
    with torch.inference_mode():
        assert torch.equal(runtime_compiled(model, "onnxruntime")(x), model(x))
    assert last_report().subgraphs == []
    with pytest.raises(embedl_dynamo.ExportError, match=r"allow_rnn = True"):
        embedl_dynamo.export(model, (x,), tmp_path / "m.onnx", backend="onnxruntime")


def test_an_lstm_with_proj_size_stays_in_pytorch(allow_rnn):
    """ONNX's LSTM has no projection: the row keeps it, the head still runs on the runtime."""
    torch.manual_seed(0)
    model = _Tagger(proj_size=4).eval()
    x = torch.randn(2, 5, 8)
    compiled = runtime_compiled(model, "onnxruntime", min_subgraph_size=1)
    with torch.inference_mode():
        assert_conforms(model(x), compiled(x), Verdict.BOUNDED, "proj_size")
    (sub,) = last_report().subgraphs
    assert [k["op"] for k in sub.kept] == ["lstm"], sub.kept
    assert (
        "lstm(proj_size) on torch.float32 stays in PyTorch on onnxruntime" in sub.kept[0]["reason"]
    )


def test_other_forms_are_other_ops(allow_rnn):
    names: list[str | None] = []

    def backend(gm, inputs):
        names.extend(op_name(n) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    for model, x in (
        (nn.GRU(4, 5).half(), torch.randn(3, 2, 4).half()),
        (nn.LSTM(4, 5, proj_size=2, bias=False), torch.randn(3, 2, 4)),
        (nn.RNN(4, 5, nonlinearity="relu"), torch.randn(3, 2, 4)),
    ):
        torch._dynamo.reset()
        torch.compile(model.eval(), backend=backend)(x)
    recurrent = [n for n in names if n is not None and n.startswith(("lstm", "gru", "rnn"))]
    assert recurrent == ["gru(not float32)", "lstm(proj_size)", "rnn_relu"]


@NO_OPENVINO
def test_openvino_warm_start_compiles_from_the_file(allow_rnn):
    """OpenVINO's import of a compiled one-directional LSTM for static sizes computes other
    values: none is stored, and a second compile (a warm start) matches eager as the first."""
    torch.manual_seed(0)
    model = nn.LSTM(6, 10).eval()
    x = torch.randn(5, 3, 6)
    with torch.inference_mode():
        for start in ("cold", "warm"):
            out = compile_on(model, "openvino")(x)
            assert_conforms(model(x), out, Verdict.BOUNDED, start)
            ran, kept = placement(last_report().subgraphs, "openvino")
            assert ran and not kept, (start, kept)
            torch._dynamo.reset()


def test_the_export_writes_an_lstm(allow_rnn, tmp_path):
    torch.manual_seed(0)
    path = embedl_dynamo.export(
        _Tagger().eval(), (torch.randn(2, 5, 8),), tmp_path / "m.onnx", backend="openvino"
    )
    assert path.is_file()


def _runtime_outputs(runtime: str, model: nn.Module, *args: torch.Tensor) -> list[torch.Tensor]:
    """``model``'s outputs computed by ``runtime`` itself from its ONNX export, no guard."""
    import io

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, buffer, dynamo=False)
    feeds = [a.numpy() for a in args]
    if runtime == "onnxruntime":
        import onnxruntime

        session = onnxruntime.InferenceSession(buffer.getvalue())
        names = [i.name for i in session.get_inputs()]
        return [torch.from_numpy(o) for o in session.run(None, dict(zip(names, feeds)))]
    import openvino

    core = openvino.Core()
    hint = {"INFERENCE_PRECISION_HINT": "f32"}
    compiled = core.compile_model(core.read_model(buffer.getvalue(), b""), "CPU", hint)
    results = compiled(feeds)
    return [torch.from_numpy(results[port]) for port in compiled.outputs]


@pytest.mark.parametrize(
    ("runtime", "layer", "where", "edge"),
    [
        ("onnxruntime", nn.LSTM(6, 10), "input", float("nan")),
        ("onnxruntime", nn.GRU(6, 10), "state", float("inf")),
        ("onnxruntime", nn.RNN(6, 10, nonlinearity="relu"), "input", float("nan")),
        pytest.param(
            "openvino", nn.RNN(6, 10, nonlinearity="relu"), "input", float("inf"), marks=NO_OPENVINO
        ),
    ],
    ids=["ort-lstm-nan", "ort-gru-state-inf", "ort-relu-nan", "ov-relu-inf"],
)
def test_the_listed_non_finite_differences_show(runtime, layer, where, edge):
    """What the rows list: the runtime's own outputs hold numbers where PyTorch's hold NaN."""
    torch.manual_seed(0)
    model = _WithState(layer).eval()
    x, h = torch.randn(5, 3, 6), torch.zeros(1, 3, 10)
    if where == "input":
        x[1, 1, 2] = edge
    else:
        h[0, 1, 2] = edge
    with torch.no_grad():
        expected = model(x, h)
    actual = _runtime_outputs(runtime, model, x, h)[0]
    assert torch.isnan(expected).any()
    assert not torch.equal(torch.isnan(actual), torch.isnan(expected))


class _WithState(nn.Module):
    """A layer's output sequence from an initial state (both of an LSTM's from one)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        state = (h, h) if isinstance(self.layer, nn.LSTM) else h
        return self.layer(x, state)[0]
