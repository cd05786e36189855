"""The graph pipeline shared by ``torch.compile`` and the export helper.

``run_pipeline`` takes a *frozen* torch-level graph (weights are ``get_attr`` constants, see
:mod:`embedl_dynamo.graph.freeze`) and runs, in order:

1. canonicalisation and the Backend's conversions to a fixpoint, then its fusions, planned
   longest first (:func:`~embedl_dynamo.rewrite.engine.plan_transformation` /
   :func:`~embedl_dynamo.rewrite.engine.apply_transformation_plan`);
2. the stage of ``settings.precision`` (:class:`~embedl_dynamo.precision.Precision`, from its
   registry): for ``fp16``/``bf16``, half-precision casting with the sensitive ops in fp32
   (:func:`~embedl_dynamo.quant.half.stage.half_stage`); for ``int8``/``mixed``, the
   Backend's quantizer (:func:`~embedl_dynamo.quant.int8.stage.int8_stage`); for ``fp32``, none.

It knows nothing about Dynamo or runtimes, so any caller that has a frozen graph can use it.
:func:`quantize` and :func:`prepare_qat` run the same stages on a plain module and return the
fake-quant GraphModule (for inspection, export or quantization-aware training).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn

from embedl_dynamo.backend import Backend, as_backend
from embedl_dynamo.quant.int8.qat import make_trainable
from embedl_dynamo.quant.int8.spec import QuantizationConfig
from embedl_dynamo.quant.int8.stage import quantize_graph
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation
from embedl_dynamo.rewrite.plan import TransformationPlan
from embedl_dynamo.settings import Settings

__all__ = ["PipelineResult", "prepare_qat", "quantize", "run_pipeline"]

logger = logging.getLogger(__name__)


@dataclass
class PipelineResult:
    """What :func:`run_pipeline` returns.

    Attributes:
        model: the transformed (and, if asked, quantized) GraphModule.
        plan: the transformation plan (``print(plan)`` shows every match and why it was or was
            not applied).
        report: counts from the plan plus ``precision``, ``quantized``, ``layers`` (one record
            per layer whose precision was decided: id, precision, reason) and per-step timings
            in seconds.
        float_model: the transformed model before the precision stage (same as ``model`` for
            fp32).
    """

    model: fx.GraphModule
    plan: TransformationPlan
    report: dict[str, Any] = field(default_factory=dict)
    float_model: fx.GraphModule | None = None


def run_pipeline(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    backend: Backend,
    settings: Settings | None = None,
) -> PipelineResult:
    """Canonicalise, convert, fuse and (optionally) quantize a frozen graph.

    Args:
        gm: the frozen graph; not modified.
        example_inputs: one real input per placeholder (used for shapes and calibration).
        backend: the target whose patterns are used.
        settings: the settings (defaults when None); ``precision`` picks the stage, which
            reads the options it needs.

    Returns:
        A :class:`PipelineResult`.
    """
    settings = settings if settings is not None else Settings()
    start = time.perf_counter()
    patterns = [*backend.conversion_patterns, *backend.fusion_patterns]
    plan = plan_transformation(gm, patterns, args=list(example_inputs))
    result = apply_transformation_plan(plan)
    report: dict[str, Any] = dict(result.report)
    report["backend"] = backend.name
    report["applied_by_pattern"] = {
        name: counts["applied"] for name, counts in report["patterns"].items() if counts["applied"]
    }
    report["transform_s"] = round(time.perf_counter() - start, 4)
    model = float_model = result.model
    report["precision"] = settings.precision.name
    report["quantized"] = False
    stage = settings.precision.load_stage()
    if stage is not None:
        model, entries = stage(float_model, list(example_inputs), backend, settings)
        report.update(entries)
    logger.debug(
        "pipeline on backend %s: %s fusions/conversions applied in %.3f s",
        backend.name,
        report.get("applied_count"),
        report["transform_s"],
    )
    return PipelineResult(model=model, plan=plan, report=report, float_model=float_model)


def quantize(
    model: nn.Module,
    args: Sequence[Any],
    config: QuantizationConfig | None = None,
    forward_loop: Callable[[nn.Module], Any] | None = None,
    *,
    calibration_data: Iterable[Any] | None = None,
    backend: Backend | str | None = None,
    observer: str | None = None,
    cache_dir: Any = None,
    progress: bool | None = None,
) -> fx.GraphModule:
    """Fuse and quantize ``model``: the fake-quant GraphModule, for inspection, export or QAT.

    Args:
        model: an ``nn.Module`` or GraphModule (not modified).
        args: example inputs.
        config: quantization config; the backend's when None.
        forward_loop: callable running calibration data through the model it is given.
        calibration_data: batches instead of ``forward_loop`` (default: ``[args]``).
        backend: Backend or name; the active one when None.
        observer: activation observer override.
        cache_dir: calibration cache root (None: no cache).
        progress: tqdm bar.

    Returns:
        The quantized GraphModule; ``gm.meta[QUANTIZATION_META]`` (`embedl_dynamo.quant.int8.stage`)
        holds the report.

    Example:
        ```python
        gm = embedl_dynamo.quantize(model.eval(), (x,), calibration_data=batches, backend="openvino")
        y = gm(x)  # fake-quantized in PyTorch
        ```
    """
    target = as_backend(backend)
    if forward_loop is not None and calibration_data is not None:
        raise ValueError("give forward_loop or calibration_data, not both")
    data = forward_loop if forward_loop is not None else calibration_data
    if data is None:
        data = [tuple(args)]
    quantizer = target.quantizer if config is None else target.quantizer.with_config(config)
    plan = plan_transformation(
        model, [*target.conversion_patterns, *target.fusion_patterns], args=tuple(args)
    )
    fused = apply_transformation_plan(plan).model
    quantized, _ = quantize_graph(
        fused,
        quantizer,
        data,
        observer=observer,
        cache_dir=cache_dir,
        use_cache=cache_dir is not None,
        progress=progress,
    )
    return quantized


def prepare_qat(
    model: nn.Module,
    args: Sequence[Any],
    config: QuantizationConfig | None = None,
    forward_loop: Callable[[nn.Module], Any] | None = None,
    *,
    calibration_data: Iterable[Any] | None = None,
    backend: Backend | str | None = None,
    observer: str | None = None,
) -> fx.GraphModule:
    """A trainable fake-quant copy of ``model`` (``model`` itself is not modified).

    The arguments are those of [quantize][embedl_dynamo.quantize].

    Returns:
        A GraphModule in train mode whose float weights (the originals behind the weight
        quantizers) require grad; fine-tune it with any optimizer, then ``eval()``.

    Example:
        ```python
        qat = embedl_dynamo.prepare_qat(model, (x,), calibration_data=batches, backend="openvino")
        loss = loss_fn(qat(x), target)  # train it as a module, then export
        ```
    """
    qat = quantize(
        model,
        args,
        config,
        forward_loop,
        calibration_data=calibration_data,
        backend=backend,
        observer=observer,
    )
    return make_trainable(qat)
