"""Writing an export: the stages' progress, the ONNX file written beside its target, verified
and renamed into place, and the JSON sidecar that describes it.

Everything is written under a temporary name first and renamed into place only once it
verifies, so a failed export never destroys a file that was there before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from embedl_dynamo.backend import Backend
from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.cache.files import file_mode
from embedl_dynamo.cache.keys import library_versions
from embedl_dynamo.deploy.export_guards import ExportGuards
from embedl_dynamo.deploy.index_flag import INDEX_FLAG_OUTPUT, with_index_flag, write_index_flag
from embedl_dynamo.deploy.sidecar import SIDECAR_FORMAT, data_file_record, io_specs
from embedl_dynamo.deploy.verify import Verification, verify_onnx
from embedl_dynamo.errors import ExportError, VerificationError
from embedl_dynamo.graph.capture import DYNAMIC_AXES_META
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.onnx.export import export_onnx, input_names, output_names
from embedl_dynamo.onnx.external_data import data_path
from embedl_dynamo.pipeline import PipelineResult
from embedl_dynamo.runtimes.registry import runtime_classes, runtime_lint
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning.judge import format_cosine, judging_sample

__all__ = ["ExportStages", "build_sidecar", "verification_message", "write_verified"]


class ExportStages:
    """The progress bar over the export stages and the time each took."""

    def __init__(self, total: int, show: bool | None) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=total,
            desc="export",
            unit="stage",
            disable=None if show is None else not show,  # None: only on a terminal
            leave=False,
        )
        self.timings: dict[str, float] = {}
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def run(self, name: str, timed: bool = True) -> Iterator[None]:
        """One stage: shown while it runs, timed as ``<name>_s``, counted when it ends."""
        self.bar.set_postfix_str(name)
        t0 = self.start if name == "capture" else time.perf_counter()
        yield
        if timed:
            self.timings[f"{name}_s"] = time.perf_counter() - t0
        self.bar.update()

    def close(self) -> None:
        self.bar.close()


@contextlib.contextmanager
def _temporary_file(path: Path) -> Iterator[Path]:
    """``path``'s name in a new directory beside it, removed at the end with whatever was
    not renamed into place: the model and its data file (:func:`data_path`, named after the
    model, so its recorded location is already the final one) are written there first, so a
    failed export never destroys a file that was there before."""
    try:
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", dir=path.parent))
    except OSError as exc:
        raise ExportError(
            f"cannot write to directory {str(path.parent)!r} ({exc.strerror}); "
            "choose a writable path"
        ) from exc
    try:
        yield tmp_dir / path.name
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _move_into_place(tmp: Path, path: Path) -> None:
    """Rename the model's data file (when it has one) and then the model into place; a data
    file left beside ``path`` by an earlier export, which the new model does not use, is
    removed."""
    mode = file_mode()  # like any file the user writes: honour the umask
    data, old_data = data_path(tmp), data_path(path)
    has_data = data.exists()
    if has_data:
        os.chmod(data, mode)
        os.replace(data, old_data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    if not has_data:
        old_data.unlink(missing_ok=True)


def declared_axes(model: Any) -> DynamicAxes | None:
    """The dynamic axes :func:`~embedl_dynamo.graph.capture.capture` found for the axes the
    caller declared (``export(dynamic_shapes=...)``); None: the batch axis alone."""
    return getattr(model, "meta", {}).get(DYNAMIC_AXES_META)


def _export_file(
    model: Any, args: tuple[torch.Tensor, ...], tmp: Path, dynamic_batch: bool, opset: int | None
) -> None:
    """Write and check the ONNX file; an op ONNX cannot express names the way out."""
    axes = declared_axes(model)  # export(dynamic_shapes=...): the captured graph's axes
    try:
        export_onnx(model, args, tmp, dynamic_batch=dynamic_batch, opset=opset, dynamic_axes=axes)
        onnx.checker.check_model(str(tmp))
    except ExportError as exc:
        raise ExportError(
            f"{exc}. The op stays in PyTorch under torch.compile; for export, replace "
            "it or raise the opset (opset=...)"
        ) from exc


def write_verified(
    path: Path,
    model: nn.Module | Callable[..., Any],
    args: tuple[torch.Tensor, ...],
    result: PipelineResult,
    settings: Settings,
    stages: ExportStages,
    opset: int | None,
    verify: bool,
    tolerance: float | None,
    target: str = "",
    guards: ExportGuards | None = None,
) -> tuple[Verification, int | None]:
    """Export, verify and rename the file into place (unless ``verify`` and it fails).

    ``model`` is the user's model, returning its outputs in the graph's order; ``target`` the
    export's target name (a file ONNX Runtime cannot run is advised for another runtime);
    ``guards``: where the pipeline's graph ends with the index flag, the file names it
    (:func:`~embedl_dynamo.deploy.index_flag.write_index_flag`) and it is verified too.

    Returns:
        The verification and the opset written.
    """
    flagged = guards is not None and bool(guards.index_ops)
    with _temporary_file(path) as tmp:
        with stages.run("onnx"):
            _export_file(result.model, args, tmp, settings.dynamic_batch, opset)
            batch_input = write_index_flag(tmp) if flagged else None
        with stages.run("verify"):
            lowered = result.model is not result.float_model  # INT8, half: its own graph
            reference = result.model if lowered else model
            if flagged:  # the file's flag is compared too: False on the inputs PyTorch takes
                reference = with_index_flag(reference, lowered, batch_input)
                model = with_index_flag(model, False, batch_input)
            extra = judging_sample(list(args), settings.calibration_data)[1:]
            try:
                check = verify_onnx(
                    tmp,
                    args,
                    reference,
                    model,
                    settings.precision,
                    settings.dynamic_batch,
                    tolerance,
                    settings.accuracy_budget,
                    extra,
                    target,
                )
            except VerificationError as exc:  # ONNX Runtime could not run the file
                if verify:
                    raise
                nan = float("nan")
                check = Verification(nan, None, "model (not run)", (), None, str(exc))
        message = verification_message(path, check, settings)
        if not check.passed and verify:
            raise VerificationError(
                f"{message}. Nothing was written (files already at {path.name} are "
                "untouched); disable the plan entry at fault, or pass verify=False to write "
                "the file anyway."
            )
        written_opset = next(
            (
                o.version
                for o in onnx.load(str(tmp), load_external_data=False).opset_import
                if o.domain in ("", "ai.onnx")
            ),
            None,
        )
        _move_into_place(tmp, path)
    return check, written_opset


def verification_message(path: Path, check: Verification, settings: Settings) -> str:
    """The judge's reason (or that it passed), with what was measured."""
    measured = f"max abs diff {check.max_abs_diff:.3g} vs the {check.compared_with}"
    if check.cosine_to_float is not None:
        measured += (
            f", cosine {format_cosine(check.cosine_to_float, settings.accuracy_budget)} to the "
            f"float model (accuracy_budget {settings.accuracy_budget})"
        )
    verdict = check.failure or "passes"
    return f"{path.name}: {verdict} ({measured})"


def build_sidecar(
    path: Path,
    target: Backend,
    args: tuple[torch.Tensor, ...],
    outputs: list[torch.Tensor],
    result: PipelineResult,
    settings: Settings,
    written: tuple[Verification, int | None],
    timings: dict[str, float],
    guards: ExportGuards | None = None,
) -> dict[str, Any]:
    """The JSON sidecar: what was exported, how, what verification measured and the guards
    ``load()`` applies (``guards``: :meth:`ExportGuards.to_dict
    <embedl_dynamo.deploy.export_guards.ExportGuards.to_dict>`)."""
    check, written_opset = written
    dynamic_batch, axes = settings.dynamic_batch, declared_axes(result.model)
    batch = args[0].shape[0] if args[0].dim() > 0 else None
    quantized = bool(result.report.get("quantized"))
    proto = onnx.load(str(path))
    return {
        "format": SIDECAR_FORMAT,
        "onnx_file": path.name,
        "onnx_sha256": sha256_file(path),
        **data_file_record(path),
        "engine_file": None,
        "engine_sha256": None,
        "backend": target.to_dict(),
        "runtime": None,  # export(): the runtime the file runs on (deploy.sidecar.runtime_record)
        "inputs": io_specs(
            input_names(len(args)), args, batch, dynamic_batch, axes and axes.inputs
        ),
        "outputs": _output_specs(proto, outputs, batch, dynamic_batch, axes),
        "output_tree": None,  # export(): the model's output structure (graph.output_tree)
        "opset": written_opset,
        "tensorrt_lint": runtime_lint(target, proto),
        "precision": settings.precision.name,
        "quantized": quantized,
        "layers": result.report.get("layers", []),
        "plan": result.plan.summary(),
        "report": {k: v for k, v in result.report.items() if k != "quantization"},
        "quantization": _quantization(result) if quantized else None,
        "verification": {
            "max_abs_diff": check.max_abs_diff,
            "tolerance": check.tolerance,
            "compared_with": check.compared_with,
            "batch_sizes": list(check.batch_sizes),
            "cosine_to_float": check.cosine_to_float,
            "accuracy_budget": None if check.tolerance is not None else settings.accuracy_budget,
            "passed": check.passed,
            "failure": check.failure,
        },
        "guards": guards.to_dict() if guards is not None else None,
        "settings": settings.to_dict(),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "versions": library_versions(runtime_classes().values()),
    }


def _output_specs(
    proto: onnx.ModelProto,
    outputs: list[torch.Tensor],
    batch: int | None,
    dynamic_batch: bool,
    axes: DynamicAxes | None,
) -> list[dict[str, Any]]:
    """The sidecar's ``outputs``: each output's name, shape and dtype; the index flag, where
    the file ends with it, as the file writes it (over the batch axis, or 0-d)."""
    names = [o.name for o in proto.graph.output]
    if not names or names[-1] != INDEX_FLAG_OUTPUT:
        names = output_names(len(outputs))
        return io_specs(names, outputs, batch, dynamic_batch, axes and axes.outputs)
    specs = io_specs(names[:-1], outputs[:-1], batch, dynamic_batch, axes and axes.outputs)
    dims = proto.graph.output[-1].type.tensor_type.shape.dim
    shape = [d.dim_param or d.dim_value for d in dims]
    return [*specs, {"name": INDEX_FLAG_OUTPUT, "shape": shape, "dtype": "bool"}]


def _quantization(result: PipelineResult) -> dict[str, Any]:
    """The sidecar's quantization section: scales, layers in INT8 and in float, and why."""
    quant_report = result.report.get("quantization") or {}
    return {
        "scales": quant_report.get("ranges"),
        "quantized_layers": quant_report.get("quantized_layers", []),
        "float_layers": quant_report.get("float_layers", []),
        "ranges_from": quant_report.get("ranges_from"),
        "config": quant_report.get("config"),
    }
