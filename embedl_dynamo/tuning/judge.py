"""The one verdict on an artifact's outputs, for ``torch.compile`` and ``export()`` alike.

Every verdict first requires PyTorch's structure (:func:`check_structure`): as many outputs,
each of the same shape and dtype. Then two rules, one per kind of artifact:

* **float** (:func:`check_float`): every output within ``rtol`` of its scale,
  ``max|a - e| <= rtol * max(1, max|e|)``, against the graph Dynamo gave (float32 kernels
  reorder sums, so bit equality is not expected); integer outputs must be equal, NaN and
  infinities where the reference has them. ``rtol`` is the runtime's declared
  :attr:`~embedl_dynamo.runtimes.base.Runtime.float_rtol` (:data:`FLOAT_RTOL` for the float32
  CPU runtimes and for an exported file, which ONNX Runtime verifies; 1e-3 for TensorRT's TF32
  layers): one rule, the same artifact on the same runtime passes or fails alike. A runtime
  applies it on the build sample, the input the export traced; where the judging sample holds
  more (:func:`check_float_sample`), on those batches too: an artifact that folded its inputs
  into a constant answers right on the traced input alone.
* **lower precision** (INT8, FP16, BF16, mixed; :func:`check_precision_outputs`): no NaN/inf,
  and :func:`cosine` to the float model's outputs ``>= accuracy_budget`` on every batch of the
  judging sample (:func:`judging_sample`), the worst batch counting. A batch of large scale
  cannot hide a bad one, as it would in one pooled cosine.

:func:`flat_outputs` is the one way outputs (tensors, nested tuples/lists/dicts such as an HF
``ModelOutput``) become a flat list. A runtime (below this layer) is given :func:`judge_artifact`
by its caller and applies it on the build sample.

Speed is judged by :data:`LOWER_PRECISION_MARGIN`: a lower precision is chosen over float only
when it takes at most that fraction of float's time, so timing noise cannot pick it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from embedl_dynamo.errors import OutputMismatchError
from embedl_dynamo.graph.float32 import exact_float32
from embedl_dynamo.graph.rest_precision import rest_precision
from embedl_dynamo.quant.half.stage import HALF_PRECISION_META
from embedl_dynamo.quant.int8.stage import QUANTIZATION_META
from embedl_dynamo.runtimes.base import ArtifactJudge, Runtime
from embedl_dynamo.runtimes.reference import graph_call, graph_outputs

__all__ = [
    "FLOAT_RTOL",
    "LOWER_PRECISION_MARGIN",
    "check_finite",
    "check_float",
    "check_float_sample",
    "check_precision",
    "check_precision_outputs",
    "check_structure",
    "cosine",
    "flat_outputs",
    "format_cosine",
    "judge_against",
    "judge_artifact",
    "judging_sample",
    "sample_outputs",
    "worst_cosine",
]

LOWER_PRECISION_MARGIN = 0.97  # at least 3% faster than float as a whole, or float runs

#: a float artifact's bound, relative to each output's scale ``max(1, max|e|)``, for the
#: float32 runtimes and exported files (ONNX Runtime verifies them); a runtime declares its own
#: (:attr:`~embedl_dynamo.runtimes.base.Runtime.float_rtol`: TensorRT's TF32 layers take 1e-3)
FLOAT_RTOL = 1e-4


def flat_outputs(out: Any) -> list[torch.Tensor]:
    """A model's output (a tensor, or nested tuples/lists/dicts of tensors such as an HF
    ``ModelOutput``) as a flat list, dicts in key order.

    Raises:
        TypeError: a leaf is not a tensor (the message names its type).
    """
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flat_outputs(item)]
    if isinstance(out, Mapping):
        return [t for item in out.values() for t in flat_outputs(item)]
    raise TypeError(f"the model returned a {type(out).__name__}; only tensor outputs compare")


def sample_outputs(
    model: Callable[..., Any], sample: Sequence[Sequence[torch.Tensor]]
) -> list[list[torch.Tensor]]:
    """``model``'s :func:`flat_outputs` on each batch of ``sample`` (no grad, IEEE float32:
    :func:`~embedl_dynamo.graph.float32.exact_float32`)."""
    with torch.no_grad(), exact_float32():  # past FX's call wrapper: see graph_outputs
        return [flat_outputs(graph_call(model, batch)) for batch in sample]


def cosine(expected: Sequence[Any], actual: Sequence[Any]) -> float:
    """Cosine similarity of two output lists (tensors or arrays), flattened and concatenated.

    Defined everywhere, so a budget compares it safely: an output holding NaN or infinity gives
    -1.0 (the worst, failing every budget); two all-zero outputs give 1.0 (they agree), one
    all-zero against a nonzero one 0.0.
    """
    e = torch.cat([torch.as_tensor(t).detach().reshape(-1).double().cpu() for t in expected])
    a = torch.cat([torch.as_tensor(t).detach().reshape(-1).double().cpu() for t in actual])
    if e.shape != a.shape:
        raise OutputMismatchError(f"{a.numel()} output values, expected {e.numel()}")
    if not (torch.isfinite(e).all() and torch.isfinite(a).all()):
        return -1.0
    e_norm, a_norm = float(e.norm()), float(a.norm())
    if not e_norm or not a_norm:
        return 1.0 if e_norm == a_norm else 0.0
    value = float(e @ a) / (e_norm * a_norm)
    return value if math.isfinite(value) else -1.0


def check_float(
    expected: Sequence[torch.Tensor],
    actual: Sequence[Any],
    what: str,
    rtol: float = FLOAT_RTOL,
) -> float:
    """The float verdict: raise :class:`OutputMismatchError` unless every output of ``actual``
    is within ``rtol`` of ``expected``'s, relative to its scale (``max(1, max|e|)`` over the
    finite values), with NaN and infinities exactly where ``expected`` has them.

    Returns:
        The worst ``max|a - e| / max(1, max|e|)`` seen.
    """
    check_structure(expected, actual, what)
    worst = 0.0
    for i, (e, a) in enumerate(zip(expected, actual)):
        a = torch.as_tensor(a).to(e.device)
        if e.numel() == 0:
            continue
        if not e.is_floating_point():
            if not torch.equal(e, a.to(e.dtype)):
                raise OutputMismatchError(f"{what}: integer output {i} differs")
            continue
        e, a = e.detach(), a.detach().to(e.dtype)
        _same_non_finite(e, a, f"{what}: output {i}")
        finite = torch.isfinite(e)
        if not bool(finite.any()):
            continue
        scale = max(1.0, float(e[finite].abs().max()))
        err = float((a[finite] - e[finite]).abs().max()) / scale
        if not err <= rtol:  # also catches NaN
            raise OutputMismatchError(
                f"{what}: output {i} differs from PyTorch by {err:.3g} relative to its scale "
                f"(allowed {rtol:g})"
            )
        worst = max(worst, err)
    return worst


def check_structure(expected: Sequence[torch.Tensor], actual: Sequence[Any], what: str) -> None:
    """Raise :class:`OutputMismatchError` unless ``actual`` has as many outputs as ``expected``,
    each of the same shape and dtype: an ``int32`` where PyTorch gives ``int64`` (an integer
    ``cumsum``) is a different answer even where the values agree, since what the caller
    computes from it next (``x * 10**6``) overflows differently."""
    if len(expected) != len(actual):
        raise OutputMismatchError(f"{what}: {len(actual)} outputs, expected {len(expected)}")
    for i, (e, a) in enumerate(zip(expected, actual)):
        a = torch.as_tensor(a)
        if tuple(e.shape) != tuple(a.shape):
            raise OutputMismatchError(
                f"{what}: output {i} has shape {tuple(a.shape)}, expected {tuple(e.shape)}"
            )
        if e.dtype != a.dtype:
            raise OutputMismatchError(
                f"{what}: output {i} has dtype {_dtype_name(a.dtype)}, PyTorch gives "
                f"{_dtype_name(e.dtype)}"
            )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _same_non_finite(expected: torch.Tensor, actual: torch.Tensor, what: str) -> None:
    """NaN where the reference has NaN, and the same infinities where it has them (``log(0)``,
    a fully masked softmax row): position by position, nowhere else."""
    nan = torch.isnan(expected)
    inf = torch.isinf(expected)
    same_nan = torch.equal(nan, torch.isnan(actual))
    same_inf = torch.equal(inf, torch.isinf(actual)) and torch.equal(expected[inf], actual[inf])
    if not (same_nan and same_inf):
        raise OutputMismatchError(
            f"{what} differs from PyTorch: NaN or infinity where PyTorch's output has none, or "
            "the reverse"
        )


def format_cosine(value: float, bound: float) -> str:
    """``value`` with at least four decimals, and as many more as it takes to show on which
    side of ``bound`` it lies (``0.99999994`` against a budget of 1 is not ``1.0000``)."""
    for decimals in range(4, 17):
        text = f"{value:.{decimals}f}"
        if (float(text) < bound) == (value < bound):
            return text
    return repr(value)


def check_finite(outputs: Sequence[Any], what: str) -> None:
    """Raise :class:`OutputMismatchError` naming the first output that holds NaN or infinity."""
    for i, out in enumerate(outputs):
        out = torch.as_tensor(out)
        if out.is_floating_point() and not torch.isfinite(out).all():
            bad = int((~torch.isfinite(out)).sum())
            raise OutputMismatchError(f"{what}: output {i} holds {bad} NaN/inf value(s)")


def worst_cosine(
    float_outputs: Sequence[Sequence[torch.Tensor]],
    outputs: Sequence[Sequence[Any]],
    what: str = "the artifact",
) -> float:
    """The least :func:`cosine` over the batches (one list of flat outputs per batch, in the
    same order), each batch's structure checked first (:func:`check_structure`): a batch of
    large scale cannot hide a bad one, as it would in one pooled cosine. NaN or infinity in a
    batch gives -1.0 (:func:`cosine`)."""
    worst = 1.0
    for expected, actual in zip(float_outputs, outputs, strict=True):
        check_structure(expected, actual, what)
        worst = min(worst, cosine(expected, actual))
    return worst


def check_precision_outputs(
    float_outputs: Sequence[Sequence[torch.Tensor]],
    outputs: Sequence[Sequence[Any]],
    budget: float,
    what: str = "the artifact",
) -> float:
    """The lower-precision verdict: raise :class:`OutputMismatchError` unless every batch's
    outputs are finite and have :func:`cosine` ``>= budget`` to the float model's.

    Args:
        float_outputs: the float model's flat outputs, one list per batch.
        outputs: the artifact's, in the same order.
        budget: ``accuracy_budget``.
        what: the artifact, for the message.

    Returns:
        The worst batch's cosine.
    """
    for expected, actual in zip(float_outputs, outputs, strict=True):
        check_structure(expected, actual, what)
        check_finite(actual, what)
    worst = worst_cosine(float_outputs, outputs, what)
    if not worst >= budget:
        raise OutputMismatchError(
            f"{what}: cosine {format_cosine(worst, budget)} to the float model < accuracy_budget "
            f"{budget:g}"
        )
    return worst


def check_precision(
    runtime: Runtime,
    float_model: fx.GraphModule,
    sample: list[list[torch.Tensor]],
    budget: float,
) -> float:
    """:func:`check_precision_outputs` of ``runtime``'s artifact against ``float_model`` on
    each batch of ``sample``; returns the worst batch's cosine."""
    expected = sample_outputs(float_model, sample)
    return check_precision_outputs(expected, sample_outputs(runtime.infer, sample), budget)


def check_float_sample(
    runtime: Runtime, float_model: fx.GraphModule, sample: list[list[torch.Tensor]]
) -> None:
    """The float verdict (:func:`check_float`, the runtime's ``float_rtol``) on every batch
    of ``sample`` of ``runtime``'s artifact against ``float_model``.

    A runtime judges its artifact on the build sample alone (:func:`judge_artifact`), which
    is the very input its export traced: an artifact that ignores its inputs (a trace that
    folded them into one constant) answers right there and nowhere else. The other batches of
    the judging sample (:func:`judging_sample`) tell.
    """
    expected = sample_outputs(float_model, sample)
    actual = sample_outputs(runtime.infer, sample)
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        what = f"the {runtime.name} float artifact on judging batch {i}"
        check_float(e, a, what, runtime.float_rtol)


def judge_artifact(
    gm: fx.GraphModule,
    reference: Callable[[], Sequence[torch.Tensor]],
    actual: Sequence[torch.Tensor],
    what: str,
    rtol: float = FLOAT_RTOL,
) -> None:
    """What a runtime applies to its artifact's outputs on the build sample (``actual``).

    A float artifact must pass :func:`check_float` within ``rtol`` (the runtime's
    :attr:`~embedl_dynamo.runtimes.base.Runtime.float_rtol`) against ``reference()``.
    A lower-precision one (``gm`` carries :data:`~embedl_dynamo.quant.int8.stage.QUANTIZATION_META`, :data:`HALF_PRECISION_META`
    or a rest precision, :mod:`~embedl_dynamo.graph.rest_precision`) must be finite here; the caller holds it to the float model
    with :func:`check_precision`, since ``gm``'s own half-precision or fake-quant outputs are no
    tighter a reference than the budget (two correct kernels round in their own order).
    """
    if QUANTIZATION_META in gm.meta:
        check_finite(actual, f"INT8 {what}")
    elif HALF_PRECISION_META in gm.meta:
        check_finite(actual, f"{gm.meta[HALF_PRECISION_META]} {what}")
    elif rest_precision(gm) is not None:
        check_finite(actual, f"{rest_precision(gm)} {what}")
    else:
        check_float(reference(), actual, what, rtol)


def judge_against(
    original: fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    lower: Sequence[fx.GraphModule] = (),
) -> ArtifactJudge:
    """:func:`judge_artifact` with ``original``'s outputs as the float reference; the graphs in
    ``lower`` (a lower precision's, held to the budget by the caller) need finite outputs only.

    ``original`` is the graph before any rewrite (the one Dynamo gave, frozen): a rewrite that
    changed the results then fails the first call instead of passing against its own graph.
    Its outputs on ``inputs`` are computed once, when a float artifact is first judged.
    """
    expected: list[tuple[torch.Tensor, ...]] = []

    def reference() -> tuple[torch.Tensor, ...]:
        if not expected:
            expected.append(graph_outputs(original, inputs))
        return expected[0]

    def judge(
        gm: fx.GraphModule,
        _own: Callable[[], Sequence[torch.Tensor]],
        actual: Sequence[torch.Tensor],
        what: str,
        rtol: float = FLOAT_RTOL,
    ) -> None:
        if any(gm is graph for graph in lower):
            check_finite(actual, what)
        else:
            judge_artifact(gm, reference, actual, what, rtol)

    return judge


def judging_sample(inputs: list[torch.Tensor], data: Any) -> list[list[torch.Tensor]]:
    """What an artifact is judged on: the build sample and up to two calibration batches in
    its shapes (``accuracy_budget`` is a cosine on calibration data).

    A batch with more samples than the build's, and otherwise its shapes, is judged on its
    first ones (:func:`_cut_to`): calibration batches of 64 for a graph built at 60 judge it
    too, on inputs its export did not trace (on the traced ones alone, an artifact that folded
    its inputs into a constant answers right).
    """
    sample = [list(inputs)]
    if not isinstance(data, (list, tuple)):
        return sample  # a forward_loop, or none: the build sample only
    for batch in data:
        if len(sample) == 3:
            break
        cut = _cut_to(list(batch) if isinstance(batch, (list, tuple)) else [batch], inputs)
        if cut is not None:
            sample.append(cut)
    return sample


def _cut_to(batch: list[Any], inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """``batch`` in the shapes of ``inputs``: each tensor's first rows (dim 0) where it has
    more, the rest of its shape and its dtype the same; None where it does not fit."""
    if len(batch) != len(inputs):
        return None
    cut = []
    for b, t in zip(batch, inputs):
        if not isinstance(b, torch.Tensor) or b.dtype != t.dtype or b.dim() != t.dim():
            return None
        if t.dim() and b.shape[0] > t.shape[0]:
            b = b[: t.shape[0]]
        if b.shape != t.shape:
            return None
        cut.append(b)
    return cut
