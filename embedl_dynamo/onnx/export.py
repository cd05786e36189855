"""Export a frozen, transformed GraphModule to one self-contained ONNX file.

Weights are ``get_attr`` constants after freezing, so they become ONNX initializers (an
unfrozen Dynamo graph would turn every weight into a graph input). Dim 0 of every input that
shares the first input's batch size, and of the outputs that carry it, is named ``batch`` and
left dynamic, so one artifact serves every batch size.

Exporter choice (torch 2.13, on frozen graphs holding our fused ``call_module`` nodes): the
TorchScript-based exporter (``dynamo=False``) is much faster than ``dynamo=True``, with
the same opset, the same BatchNorm folding and ORT outputs equal up to float rounding. Cold
compile time matters, so ``dynamo=False`` is the default; ``dynamo=True`` (``torch.export``)
is used as the fallback when the first exporter fails, and can be forced with
``exporter="dynamo"``. The result always passes ``onnx.checker``.

The TorchScript exporter's graph is exported without weights, checked, and written with the
weights added from the exporter's own tensors (:mod:`.onnx_initializers`): the same file,
without the exporter copying every weight into a protobuf, writing it and reading it back to
fold and check.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn
from torch.utils._python_dispatch import _disable_current_modes

from embedl_dynamo.errors import ExportError, error_line
from embedl_dynamo.graph.dynamic_axes import DynamicAxes
from embedl_dynamo.graph.exact_ops import exact_lowering
from embedl_dynamo.graph.rest_precision import ONNX_REST_PRECISION, rest_precision
from embedl_dynamo.onnx.constant_views import mark_constant_views
from embedl_dynamo.onnx.exporter_hooks import (
    capture_initializers,
    shape_inference_without_weights,
)
from embedl_dynamo.onnx.fp8_weights import fp8_opset
from embedl_dynamo.onnx.graph_inputs import restore_dropped_inputs
from embedl_dynamo.onnx.initializer_sources import (
    mark_initializer_sources,
    record_initializer_sources,
)
from embedl_dynamo.onnx.initializers import (
    UnwrittenOnnx,
    graph_weights,
    save_quantized,
    unwritten_float_model,
)
from embedl_dynamo.onnx.int8_weights import store_weights_as_int8
from embedl_dynamo.onnx.io_axes import export_axes, input_names, output_names
from embedl_dynamo.onnx.output_dtypes import cast_outputs
from embedl_dynamo.onnx.weight_only import (
    save_weight_only,
    weight_only_layers,
    with_dense_weights,
)

__all__ = [
    "DEFAULT_OPSET",
    "export_onnx",
    "export_onnx_unwritten",
    "input_names",
    "output_names",
]

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 18
_EXPORTERS = ("auto", "torchscript", "dynamo")
_FD_LOCK = threading.Lock()  # file descriptors 1 and 2 are process-wide


class _FlatOutputs(nn.Module):
    """Calls the graph and returns its outputs as a flat tuple of tensors."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__()
        self.gm = gm

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _check_io(example_inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    for i, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise ExportError(f"input {i} is a {type(value).__name__}, not a tensor")
    for i, value in enumerate(outputs):
        if not isinstance(value, torch.Tensor):
            raise ExportError(f"output {i} is a {type(value).__name__}, not a tensor")


@contextlib.contextmanager
def _native_output_to_debug():
    """Send what C++ writes to stdout/stderr meanwhile to the DEBUG log, not the terminal.

    The TorchScript exporter turns its native ONNX log on unconditionally (torch 2.13's
    ``setup_onnx_logging`` tests a function, not its result) and writes the whole TorchScript
    graph to stderr when an op fails to export; :func:`export_onnx` raises one line instead.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    with _FD_LOCK, tempfile.TemporaryFile() as sink:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            text = sink.read().decode(errors="replace").strip()
            if text:
                logger.debug("ONNX exporter output:\n%s", text)


@contextlib.contextmanager
def _outside_dispatch_modes() -> Iterator[None]:
    """The exporters run with no ``TorchDispatchMode`` active (one is restored after).

    Why: the TorchScript tracer records the ops that reach its dispatch key, and a Python
    dispatch mode takes them first: what the mode returns reaches the trace as a constant. A
    graph exported under one (the weight recorder a build runs its pipeline in,
    :mod:`~embedl_dynamo.graph.weight_recorder`, around ``mixed``'s race) became one
    ``Constant`` node holding its outputs on the example inputs: right on those alone, cached
    under the graph's key and served. No mode needs to see an export: it computes nothing a
    recipe replays (an initializer the exporter folds is found by the refit itself).
    """
    with _disable_current_modes():
        yield


def _torchscript_export(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    f: Any,
    opset: int,
    axes: dict[str, dict[int, str]],
    n_out: int,
    export_params: bool,
) -> None:
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        _native_output_to_debug(),
        shape_inference_without_weights(),
    ):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            f,
            input_names=input_names(len(args)),
            output_names=output_names(n_out),
            dynamic_axes=axes or None,
            opset_version=opset,
            do_constant_folding=True,
            export_params=export_params,
            dynamo=False,
        )


def _export_torchscript(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    opset: int,
    axes: dict[str, dict[int, str]],
    n_out: int,
) -> Any:
    """The exported ``onnx.ModelProto`` (weights as inputs) and the weights' values, or None
    when the exporter had to write them to ``path`` itself (see :mod:`.onnx_initializers`)."""
    import onnx

    buffer = io.BytesIO()
    with capture_initializers() as captured, record_initializer_sources() as sources:
        _torchscript_export(module, args, buffer, opset, axes, n_out, export_params=False)
    model = onnx.load_from_string(buffer.getvalue())
    restore_dropped_inputs(model, input_names(len(args)), args, axes)
    weights = graph_weights(model, captured, set(input_names(len(args))))
    if weights is not None:
        mark_initializer_sources(model, sources)  # what a refit keeps of the exporter's folds
        return model, weights
    logger.debug("weights not captured from the exporter; it writes them itself")
    _torchscript_export(module, args, str(path), opset, axes, n_out, export_params=True)
    return None


def _export_dynamo(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    opset: int,
    axes: DynamicAxes,
    n_out: int,
) -> None:
    """Writes ``path`` (returns None, like :func:`_export_torchscript`'s fallback)."""
    dims = {name: torch.export.Dim(name) for a in axes.inputs for name in a.values()}
    shapes = (
        tuple({axis: dims[name] for axis, name in a.items()} or None for a in axes.inputs)
        if any(axes.inputs)
        else None
    )
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module,
            args,
            input_names=input_names(len(args)),
            output_names=output_names(n_out),
            dynamic_shapes=(shapes,) if shapes is not None else None,
            opset_version=opset,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
        program.save(str(path), external_data=False)
    return None


def export_onnx_unwritten(
    gm: fx.GraphModule,
    example_inputs: Sequence[torch.Tensor],
    path: str | Path,
    dynamic_axes: DynamicAxes | None = None,
    outputs: Sequence[torch.Tensor] | None = None,
) -> UnwrittenOnnx | None:
    """:func:`export_onnx` with the TorchScript exporter, leaving a float graph unwritten.

    Returns:
        The checked float model and its weights, for the caller to write to ``path`` (and
        run meanwhile); None when ``path`` was written here (a graph with Q/DQ nodes, or weights
        the exporter had to write itself).
    """
    return _export(
        gm,
        example_inputs,
        Path(path),
        True,
        None,
        "torchscript",
        dynamic_axes,
        outputs,
        keep_unwritten=True,
    )


def export_onnx(
    gm: fx.GraphModule,
    example_inputs: Sequence[torch.Tensor],
    path: str | Path,
    dynamic_batch: bool = True,
    opset: int | None = None,
    exporter: str = "auto",
    dynamic_axes: DynamicAxes | None = None,
    outputs: Sequence[torch.Tensor] | None = None,
) -> Path:
    """Export ``gm`` to a single ONNX file with constants as initializers.

    Args:
        gm: a frozen (weights as constants) GraphModule taking tensors, returning a tensor or a
            flat tuple/list of tensors; not modified.
        example_inputs: one tensor per placeholder.
        path: where to write the ``.onnx`` file.
        dynamic_batch: name dim 0 ``batch`` and leave it dynamic (when ``dynamic_axes`` is None).
        dynamic_axes: every dynamic axis by name (Dynamo's symbolic sizes); overrides
            ``dynamic_batch``.
        opset: ONNX opset (:data:`DEFAULT_OPSET` when None).
        exporter: ``auto`` (TorchScript exporter, then ``torch.export`` if it fails),
            ``torchscript`` or ``dynamo``.
        outputs: ``gm``'s outputs on ``example_inputs`` when the caller has them (for their
            count and dynamic axes); ``gm`` is run when None.

    Returns:
        ``path``, checked with ``onnx.checker``.

    Raises:
        ExportError: neither exporter could export the graph; the message names the problem.
    """
    path = Path(path)
    _export(gm, example_inputs, path, dynamic_batch, opset, exporter, dynamic_axes, outputs)
    return path


def _mark_rest_precision(model: Any, gm: fx.GraphModule) -> None:
    """Record in ``model``'s ``metadata_props`` the half type ``gm``'s unquantized layers run
    in (:mod:`~embedl_dynamo.graph.rest_precision`), where it has one."""
    name = rest_precision(gm)
    if name is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = ONNX_REST_PRECISION, name


@with_dense_weights  # weight-only layers' float weights exist only while exported
def _export(
    gm: fx.GraphModule,
    example_inputs: Sequence[torch.Tensor],
    path: Path,
    dynamic_batch: bool,
    opset: int | None,
    exporter: str,
    dynamic_axes: DynamicAxes | None,
    outputs: Sequence[torch.Tensor] | None,
    keep_unwritten: bool = False,
) -> UnwrittenOnnx | None:
    """:func:`export_onnx`; with ``keep_unwritten``, a float graph is returned unwritten."""
    import onnx

    if exporter not in _EXPORTERS:
        raise ValueError(f"invalid exporter={exporter!r}; valid values: {', '.join(_EXPORTERS)}")
    opset = fp8_opset(gm, opset, DEFAULT_OPSET)
    # the ops a runtime computes otherwise, in forms it computes as PyTorch does
    module = _FlatOutputs(exact_lowering(gm)).eval()
    args = tuple(example_inputs)
    if outputs is None:
        with torch.no_grad():
            outputs = module(*args)
    _check_io(args, outputs)
    axes, named = export_axes(args, outputs, dynamic_batch, dynamic_axes)
    order = {"auto": ("torchscript", "dynamo"), "torchscript": ("torchscript",)}.get(
        exporter, ("dynamo",)
    )
    errors = []
    for name in order:
        start = time.perf_counter()
        try:
            with torch.no_grad(), _outside_dispatch_modes():
                if name == "torchscript":
                    exported = _export_torchscript(module, args, path, opset, named, len(outputs))
                else:
                    exported = _export_dynamo(module, args, path, opset, axes, len(outputs))
            dtypes = [t.dtype for t in outputs]
            if exported is not None:
                _mark_rest_precision(exported[0], gm)
                cast_outputs(exported[0], dtypes)
                mark_constant_views(*exported, gm)
            unwritten, folded = None, 0
            if weight_only_layers(gm):  # integer weights, written as a float graph is
                folded, unwritten = save_weight_only(
                    exported, path, weight_only_layers(gm), write=not keep_unwritten
                )
            elif exported is not None:
                unwritten = unwritten_float_model(*exported)
                if unwritten is None:  # Q/DQ nodes: weights folded to int8 as it is written
                    folded = save_quantized(*exported, path)
                elif not keep_unwritten:
                    unwritten.write(path)
                    unwritten = None
            else:
                folded = store_weights_as_int8(path)
                written = onnx.load(str(path), load_external_data=False)
                if cast_outputs(written, dtypes) or rest_precision(gm) is not None:
                    _mark_rest_precision(written, gm)
                    onnx.save(written, str(path))
                onnx.checker.check_model(str(path))
        except Exception as exc:
            errors.append(f"{name} exporter: {error_line(exc, with_type=False)}")
            logger.debug("ONNX export with the %s exporter failed: %s", name, exc)
            continue
        logger.debug(
            "exported %s with the %s exporter in %.2f s (%d weights stored as int8)",
            path,
            name,
            time.perf_counter() - start,
            folded,
        )
        return unwritten
    raise ExportError("ONNX export failed: " + "; ".join(errors) + _fast_path_hint(gm))


# PyTorch's fused inference fast paths: no exporter takes them; the patterns decompose the
# unmasked forms, and without the fast path PyTorch records the layer's plain ops
_FAST_PATH_OPS = ("_transformer_encoder_layer_fwd", "_native_multi_head_attention")


def _fast_path_hint(gm: fx.GraphModule) -> str:
    """How to export a graph that holds a fast-path op (a masked ``nn.TransformerEncoder``
    layer in eval mode), or ``""``."""
    names = {getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes}
    found = [name for name in _FAST_PATH_OPS if name in names]
    if not found:
        return ""
    return (
        f". {found[0]} is PyTorch's fused inference fast path of nn.TransformerEncoderLayer/"
        "nn.MultiheadAttention (used in eval mode); call "
        "torch.backends.mha.set_fastpath_enabled(False) before compiling or exporting, and the "
        "layer is recorded as plain ops that export"
    )
