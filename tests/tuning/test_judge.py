"""The one verdict (:mod:`embedl_dynamo.tuning.judge`): float bound, cosine, per-batch budget."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
import torch
from torch import fx, nn

from embedl_dynamo.errors import OutputMismatchError
from embedl_dynamo.precision import get_precision
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.tuning.judge import (
    FLOAT_RTOL,
    check_float,
    check_float_sample,
    check_precision,
    check_precision_outputs,
    cosine,
    flat_outputs,
    format_cosine,
    judge_artifact,
)

verify = importlib.import_module("embedl_dynamo.deploy.verify")


def test_check_float_catches_mismatch():
    a = torch.ones(2, 3)
    assert check_float([a], [a + 1e-6], "x") < 1e-5
    with pytest.raises(OutputMismatchError, match="differs from PyTorch"):
        check_float([a], [a + 0.1], "x")
    with pytest.raises(OutputMismatchError, match="shape"):
        check_float([a], [a[:1]], "x")
    with pytest.raises(OutputMismatchError, match="differs"):
        check_float([a], [a * float("nan")], "x")


def test_the_float_bound_is_relative_to_each_outputs_scale():
    big = torch.full((4,), 100.0)
    check_float([big], [big + 0.9 * FLOAT_RTOL * 100], "x")
    with pytest.raises(OutputMismatchError, match="relative to its scale"):
        check_float([big], [big + 1.1 * FLOAT_RTOL * 100], "x")


def test_cosine_is_defined_everywhere():
    x = torch.tensor([1.0, 2.0, 3.0])
    assert cosine([x], [2 * x]) == pytest.approx(1.0)
    assert cosine([x], [-x]) == pytest.approx(-1.0)
    zero = torch.zeros(3)
    assert cosine([zero], [zero]) == 1.0  # both zero: they agree
    assert cosine([zero], [x]) == 0.0 and cosine([x], [zero]) == 0.0
    nan = x.clone()
    nan[1] = float("nan")
    assert cosine([x], [nan]) == -1.0  # the worst: fails every budget
    inf = x.clone()
    inf[0] = float("inf")
    assert cosine([inf], [x]) == -1.0


def test_flat_outputs_flattens_nested_containers_in_key_order():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert [t.item() for t in flat_outputs((a, {"y": b, "z": [c]}))] == [0.0, 1.0, 2.0]
    with pytest.raises(TypeError, match="returned a str"):
        flat_outputs((a, "text"))


def test_a_batch_of_large_scale_cannot_hide_a_bad_one():
    """Judged per batch, the worst cosine counts: pooled, a calibration batch 1000x larger
    would dominate the dot product and the norms, and the bad batch would pass."""
    torch.manual_seed(0)
    small, large = torch.randn(64), 1000 * torch.randn(64)
    bad_small = -small  # cosine -1 on its batch
    expected, actual = [[small], [large]], [[bad_small], [large]]
    pooled = cosine([small, large], [bad_small, large])
    assert pooled > 0.99  # what a pooled cosine would have said
    with pytest.raises(OutputMismatchError, match=r"cosine -1\.0000 to the float model <"):
        check_precision_outputs(expected, actual, 0.99)
    assert check_precision_outputs([[small], [large]], [[small], [large]], 0.99) == pytest.approx(
        1.0
    )


def test_nan_fails_the_precision_verdict():
    x = torch.randn(8)
    with pytest.raises(OutputMismatchError, match="NaN/inf"):
        check_precision_outputs([[x]], [[x * float("nan")]], 0.0)


# -- torch.compile and export() judge by the one rule ---------------------------------------


class _FixedRuntime(Runtime):
    """A runtime whose artifact returns ``outputs``, whatever it is given."""

    name = "fixed"

    def __init__(self, outputs: tuple[torch.Tensor, ...]) -> None:
        super().__init__()
        self.outputs = outputs

    def _build(self, gm, example_inputs):
        self.check_artifact(gm, example_inputs, "fixed artifact")

    def _infer(self, args):
        return self.outputs


def test_a_float_artifact_right_on_the_traced_input_alone_is_refused():
    """The runtime judges its artifact on the build sample, the very input its export traced:
    an artifact that folded that input into a constant answers right there alone. The other
    batches of the judging sample tell (mixed precision served such a file: 19% top-1)."""
    model = nn.Linear(4, 3).eval()
    x, other = torch.randn(2, 4), torch.randn(2, 4)
    gm = fx.symbolic_trace(model)
    with torch.no_grad():
        runtime = _FixedRuntime((model(x),)).build(gm, [x], judge_artifact)  # right on x
        check_float_sample(runtime, gm, [[x]])
        with pytest.raises(OutputMismatchError, match="fixed float artifact on judging batch 0"):
            check_float_sample(runtime, gm, [[other]])


def _compile_accepts(model, x, outputs, precision: str, budget: float) -> bool:
    """The compile path: the runtime's build judged by ``judge_artifact``, then (lower
    precision) :func:`check_precision` against the float model, as ``compile_subgraph`` does."""
    gm = fx.symbolic_trace(model)
    if precision != "fp32":
        gm.meta["embedl_quantization"] = {}
    try:
        runtime = _FixedRuntime(outputs).build(gm, [x], judge_artifact)
        if precision != "fp32":
            check_precision(runtime, fx.symbolic_trace(model), [[x]], budget)
    except OutputMismatchError:
        return False
    return True


def _export_accepts(model, x, outputs, precision: str, budget: float, monkeypatch) -> bool:
    """The export path: :func:`verify_onnx` on a file whose ONNX Runtime outputs are
    ``outputs`` (the fake-quant reference is the float model itself here)."""
    monkeypatch.setattr(verify, "run_onnx", lambda path, args: [o.numpy() for o in outputs])
    check = verify.verify_onnx(
        Path("unused.onnx"), (x,), model, model, get_precision(precision), False, None, budget
    )
    return check.passed


def _at_cosine(e: torch.Tensor, target: float) -> torch.Tensor:
    """``e`` plus a component orthogonal to it, so the cosine to ``e`` is ``target``."""
    r = torch.randn_like(e, dtype=torch.float64)
    flat, r = e.double().reshape(-1), r.reshape(-1)
    r = r - (r @ flat) / (flat @ flat) * flat
    r = r / r.norm() * flat.norm() * math.tan(math.acos(target))
    return (flat + r).reshape(e.shape).float()


@pytest.mark.parametrize("inside", [True, False])
def test_compile_and_export_judge_a_borderline_float_artifact_alike(inside, monkeypatch):
    torch.manual_seed(0)
    model = nn.Linear(8, 4).eval()
    x = 10 * torch.randn(2, 8)  # outputs of scale > 1: the bound is relative to it
    with torch.no_grad():
        e = model(x)
    scale = max(1.0, float(e.abs().max()))
    off = torch.zeros_like(e)
    off[0, 0] = (0.9 if inside else 1.1) * FLOAT_RTOL * scale
    outputs = (e + off,)
    compiled = _compile_accepts(model, x, outputs, "fp32", 0.99)
    exported = _export_accepts(model, x, outputs, "fp32", 0.99, monkeypatch)
    assert compiled is exported is inside


@pytest.mark.parametrize("inside", [True, False])
def test_compile_and_export_judge_a_borderline_int8_artifact_alike(inside, monkeypatch):
    torch.manual_seed(0)
    model = nn.Linear(8, 16).eval()
    x = torch.randn(4, 8)
    budget = 0.99
    with torch.no_grad():
        e = model(x)
    outputs = (_at_cosine(e, budget + (1e-4 if inside else -1e-4)),)
    assert (cosine([e], outputs) >= budget) is inside  # the construction is what it says
    compiled = _compile_accepts(model, x, outputs, "int8", budget)
    exported = _export_accepts(model, x, outputs, "int8", budget, monkeypatch)
    assert compiled is exported is inside


@pytest.mark.parametrize(
    ("value", "bound", "text"),
    [(0.99999994, 1.0, "0.9999999"), (0.98765, 0.99, "0.9877"), (0.995, 0.99, "0.9950")],
)
def test_a_cosine_is_printed_on_its_side_of_the_budget(value, bound, text):
    """Regression (issue 23 item 20): "cosine 1.0000 < accuracy_budget 1"."""
    assert format_cosine(value, bound) == text


def test_a_rejection_at_budget_one_prints_a_cosine_below_one():
    e = torch.ones(64)
    a = e.clone()
    a[0] += 1e-3
    with pytest.raises(OutputMismatchError) as caught:
        check_precision_outputs([[e]], [[a]], 1.0, "x")
    assert "cosine 1.0000 " not in str(caught.value) and "< accuracy_budget 1" in str(caught.value)


def test_a_graph_with_a_rest_precision_is_judged_as_lower_precision() -> None:
    """Its artifact computes the float layers in a half type: a float check (1e-4) would
    reject it; it must be finite here, and the caller holds it to the budget."""
    from embedl_dynamo.graph.rest_precision import with_rest_precision

    gm = with_rest_precision(fx.symbolic_trace(nn.Linear(4, 4)), "bf16")
    x = torch.randn(2, 4)
    expected = gm(x).detach()
    off = (expected * 1.01,)  # as bf16 rounds: outside the float tolerance
    judge_artifact(gm, lambda: (expected,), off, "artifact")
    with pytest.raises(OutputMismatchError):
        judge_artifact(fx.symbolic_trace(nn.Linear(4, 4)), lambda: (expected,), off, "artifact")
    with pytest.raises(OutputMismatchError):
        judge_artifact(gm, lambda: (expected,), (expected * float("nan"),), "artifact")


def test_every_verdict_compares_dtypes_and_shapes():
    """Regression (issue 39 item 2): int32 where PyTorch gives int64 passed every check."""
    e = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    with pytest.raises(OutputMismatchError, match="output 0 has dtype int32, PyTorch gives int64"):
        check_float([e], [e.int()], "x")
    with pytest.raises(OutputMismatchError, match="dtype float64, PyTorch gives float32"):
        check_float([e.float()], [e.double()], "x")
    with pytest.raises(OutputMismatchError, match="dtype float16"):
        check_precision_outputs([[e.float()]], [[e.half()]], 0.9)
    with pytest.raises(OutputMismatchError, match=r"shape \(3, 2\), expected \(2, 3\)"):
        check_precision_outputs([[e.float()]], [[e.float().reshape(3, 2)]], 0.9)
    check_precision_outputs([[e.float()]], [[e.float()]], 0.9)  # same structure passes
