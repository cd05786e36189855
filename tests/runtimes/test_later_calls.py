"""Values a runtime computed otherwise than PyTorch, on a call after a benign first one
(issue 39, "silent wrong answers" 3): the first call's check cannot see them, so each op is
exact in its export, or its graph stays in PyTorch (:mod:`embedl_dynamo.runtimes.conformance`)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from embedl_dynamo import last_report
from embedl_dynamo.runtimes.conformance import Verdict, rule_for
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.runtimes.conformance_check import assert_conforms, compile_on

NAN, INF = float("nan"), float("inf")
RUNTIMES = [
    "onnxruntime",
    pytest.param(
        "openvino",
        marks=pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino"),
    ),
]


def _mask(row_masked: bool) -> torch.Tensor:
    mask = torch.zeros(4, 4)
    if row_masked:
        mask[1] = -INF
    return mask


_ROW = torch.tensor([[0.0, 1.0, 2.0, 3.0], [4.0, 1.0, 2.0, 3.0]])
_NAN_ROW = torch.tensor([[0.0, NAN, 5.0, 3.0], [4.0, 1.0, 2.0, 3.0]])
_Q = torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(0))

# name -> (function, benign first inputs, later inputs with the edge values)
CASES = {
    "argmax_nan": (lambda x: torch.argmax(x * 1, 1), (_ROW,), (_NAN_ROW,)),
    "argmin_nan": (lambda x: (x * 1).argmin(dim=1, keepdim=True), (_ROW,), (_NAN_ROW,)),
    "amax_nan": (lambda x: torch.amax(x * 1, 1), (_ROW,), (_NAN_ROW,)),
    "min_nan": (lambda x: torch.min(x * 1), (_ROW,), (_NAN_ROW,)),
    "max_dim_nan": (lambda x: torch.max(x * 1, 1), (_ROW,), (_NAN_ROW,)),
    "maximum_nan": (lambda x: torch.maximum(x * 1, x.flip(0)), (_ROW,), (_NAN_ROW,)),
    "sdpa_fully_masked": (
        lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m),
        (_Q, _mask(False)),
        (_Q, _mask(True)),
    ),
    "sum_int64_above_2_53": (
        lambda x: torch.sum(x + 0),
        (torch.tensor([1, 2, 3]),),
        (torch.tensor([2**53, 1, 0]),),
    ),
    "sum_int64_dim": (
        lambda x: (x + 0).sum(-1),
        (torch.tensor([[1, 2, 3]]),),
        (torch.tensor([[2**53, 1, 2]]),),
    ),
    "cumsum_int32_gives_int64": (
        lambda x: torch.cumsum(x + 0, 0),
        (torch.tensor([1, 0, 1], dtype=torch.int32),),
        (torch.tensor([2**31 - 1, 1, 1], dtype=torch.int32),),
    ),
    "amax_int_above_2_24": (
        lambda x: torch.amax(x + 0, 0),
        (torch.tensor([1, 2, 3], dtype=torch.int32),),
        (torch.tensor([2**24 + 1, 5, 2**30 + 3], dtype=torch.int32),),
    ),
    # true division of integers (DeBERTa's relative positions): a zero divisor gives inf and
    # NaN, as PyTorch's float32 quotient does; the sweep's OpInfo samples have no zero divisor
    "int_truediv_by_zero": (
        lambda a, b: (a + 0) / b,
        (torch.tensor([1, 5, -3]), torch.tensor([2, 3, 4])),
        (torch.tensor([0, 5, -3]), torch.tensor([0, 0, 0])),
    ),
    "int32_number_over_zero": (
        lambda b: 7 / (b + 0),
        (torch.tensor([1, 2], dtype=torch.int32),),
        (torch.tensor([0, -2], dtype=torch.int32),),
    ),
    "topk_ties": (
        lambda x: torch.topk(x * 1, 2),
        (torch.tensor([[0.0, 1.0, 2.0, 3.0]]),),
        (torch.tensor([[1.0, 1.0, 1.0, 1.0]]),),
    ),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case", CASES)
def test_later_call_matches_eager(case, runtime):
    fn, first, later = CASES[case]
    compiled = compile_on(fn, runtime)
    assert_conforms(fn(*first), compiled(*first), Verdict.BOUNDED, f"{case} first call")
    assert_conforms(fn(*later), compiled(*later), Verdict.BOUNDED, f"{case} later call")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_topk_stays_in_pytorch_with_its_reason(runtime):
    fn, first, _ = CASES["topk_ties"]
    with pytest.warns(RuntimeWarning, match="topk"):
        compile_on(fn, runtime)(*first)
    (report,) = last_report().subgraphs
    kept = {k["op"]: k["reason"] for k in report.kept}
    assert "topk" in kept and "tied values" in kept["topk"], report


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_exact_op_runs_on_the_runtime(runtime):
    """The exact forms do not keep a graph in PyTorch: the NaN row is the runtime's answer."""
    fn, first, later = CASES["argmax_nan"]
    compiled = compile_on(fn, runtime)
    compiled(*first)
    (report,) = last_report().subgraphs
    assert report.runtime == runtime
    assert torch.equal(compiled(*later), torch.tensor([1, 0]))


@pytest.mark.parametrize("case", ["int_truediv_by_zero", "int32_number_over_zero"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_integer_true_division_runs_on_the_runtime(case, runtime):
    """It had no row for integers: DeBERTa's relative positions kept it in PyTorch."""
    fn, first, later = CASES[case]
    compiled = compile_on(fn, runtime)
    compiled(*first)
    (report,) = last_report().subgraphs
    assert report.runtime == runtime and not report.kept, report.reason
    verdict = rule_for("truediv", runtime, first[0].dtype).verdict
    assert_conforms(fn(*later), compiled(*later), verdict, case)


@pytest.mark.skipif(not OpenVINORuntime.is_available(), reason="no openvino")
def test_openvino_int64_outside_int32_runs_in_pytorch():
    """OpenVINO computes int64 as int32: such a call runs in PyTorch (one warning)."""
    fn = lambda x: x * 3 + 1  # noqa: E731
    compiled = compile_on(fn, "openvino", fallback="eager")
    small, big = torch.tensor([1, 2, 3]), torch.tensor([2**40, 1, -(2**33)])
    assert torch.equal(compiled(small), fn(small))
    assert torch.equal(compiled(big), fn(big))


@pytest.mark.parametrize("value", [NAN, float("inf"), -float("inf")])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_int8_nan_input_runs_in_pytorch(runtime, value):
    """INT8 quantizes NaN and infinities to finite codes: such a call runs in PyTorch, with
    eager's non-finite outputs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 4)
    ).eval()
    x = torch.randn(2, 3, 8, 8)
    backend = "embedl_openvino" if runtime == "openvino" else "embedl_onnxruntime"
    options = {"runtime": runtime, "precision": "int8", "calibration_data": [x] * 4}
    compiled = torch.compile(model, backend=backend, options=options)
    with torch.no_grad():
        compiled(x)
        assert "int8" in str(last_report().subgraphs[0].pipeline.get("precision"))
        assert last_report().subgraphs[0].runtime == runtime
        bad = x.clone()
        bad[0, 0, 0, 0] = value
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            expected, actual = model(bad), compiled(bad)
    # refused, not clipped: no range warning that INT8 clips it
    assert not [w for w in caught if "clips" in str(w.message)]
    assert torch.equal(actual.isfinite(), expected.isfinite()) and not actual.isfinite().all()
    assert torch.equal(actual.isnan(), expected.isnan())


def test_openvino_integer_products_run_in_pytorch_and_do_not_wrap_on_later_calls():
    """OpenVINO computes int64 as int32: products of inputs well inside int32 wrap silently
    ([3e10, -7e10] came back as [2147483645, -2147483641]). Integer products stay in PyTorch
    there, with the reason."""
    fn = lambda t: (t * 100000) * 100000  # noqa: E731
    compiled = compile_on(fn, "openvino", fallback="eager")
    assert torch.equal(compiled(torch.tensor([0, 0])), fn(torch.tensor([0, 0])))
    later = torch.tensor([3, -7])
    assert torch.equal(compiled(later), fn(later))
    (report,) = last_report().subgraphs
    assert report.runtime == "eager" and "int32" in report.reason


def test_openvino_keeps_float64_in_pytorch():
    """OpenVINO computes float64 as float32: an int32 of 2**31 - 1 made float64 came back 2**31.
    A graph with a float64 value runs in PyTorch there, with the reason."""
    fn = lambda t: t.double() + 1  # noqa: E731
    compiled = compile_on(fn, "openvino", fallback="eager")
    x = torch.tensor([2**31 - 1, 5], dtype=torch.int32)
    assert torch.equal(compiled(x), fn(x))
    (report,) = last_report().subgraphs
    assert report.runtime == "eager" and "float64" in report.reason


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
def test_8_bit_sums_wrap_as_in_pytorch(runtime, dtype):
    """uint8 250 + 10 is 4 in PyTorch; OpenVINO saturates it to 255. An 8-bit add or sub
    runs on ONNX Runtime and stays in PyTorch on OpenVINO, with the reason."""
    if runtime == "openvino" and not OpenVINORuntime.is_available():
        pytest.skip("no openvino")
    fn = lambda a, b: (a + b) - (b - a)  # noqa: E731
    compiled = compile_on(fn, runtime, fallback="eager")
    a, b = torch.tensor([1, 2], dtype=dtype), torch.tensor([3, 4], dtype=dtype)
    assert torch.equal(compiled(a, b), fn(a, b))
    big = torch.tensor([120, 127], dtype=dtype)
    assert torch.equal(compiled(big, big + 3), fn(big, big + 3))
    (report,) = last_report().subgraphs
    if runtime == "openvino":
        assert report.runtime == "eager" and "saturates" in report.reason, report.reason
    else:
        assert report.runtime == "onnxruntime", report.reason
