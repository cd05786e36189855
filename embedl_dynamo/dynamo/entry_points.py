"""The ``torch.compile`` backends: ``embedl``, ``embedl_tensorrt``, ``embedl_onnxruntime``...

``torch.compile(model, backend="embedl_tensorrt", options={...})`` works without importing
this package: our ``pyproject.toml`` registers the names in the ``torch_dynamo_backends``
entry-point group. ``embedl`` uses :func:`~embedl_dynamo.backend.get_backend` (so
``EMBEDL_DYNAMO_BACKEND=tensorrt`` picks the target) and ``embedl_<name>`` exists for every
discovered Backend through the module ``__getattr__``; a third-party target registers
``embedl_x = "embedl_dynamo.dynamo.entry_points:embedl_x"`` beside its Backend. We never claim
``tensorrt`` or ``torch_tensorrt`` (Torch-TensorRT owns them).

Settings come from ``options`` > environment > defaults (:class:`~embedl_dynamo.settings.Settings`);
each subgraph is compiled by :func:`~embedl_dynamo.dynamo.compile.compile_subgraph`. What
happened is in :func:`embedl_dynamo.last_report`. Inside PyTorch's ``aot_compile`` the result is
a :class:`~embedl_dynamo.dynamo.saved_function.SavedFunction`, which PyTorch can save and load.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from torch import fx

from embedl_dynamo.backend import Backend, backend_by_name, discover_backends, get_backend
from embedl_dynamo.cache.keys import digests_reused
from embedl_dynamo.dynamo.compile import compile_subgraph
from embedl_dynamo.dynamo.saved_function import SavedFunction, aot_compile_requested
from embedl_dynamo.errors import ConfigurationError, EmbedlDynamoError, error_line
from embedl_dynamo.precision import get_precision, precision_names
from embedl_dynamo.runtimes.registry import runtime_settings
from embedl_dynamo.settings import Settings

__all__ = [
    "embedl",
    "embedl_lattice",
    "embedl_onnxruntime",
    "embedl_openvino",
    "embedl_tensorrt",
    "make_dynamo_backend",
]

logger = logging.getLogger(__name__)
_PREFIX = "embedl_"
# torch.compile(..., mode=...) reaches every backend as a keyword; its modes are inductor's
# (CUDA graphs, autotuning) and mean nothing here. Hugging Face's CompileConfig passes
# mode="reduce-overhead" unless told otherwise, so generate(compile_config=...) sends it.
_INDUCTOR_ONLY = ("mode",)


def _compile(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    backend: Backend | None,
    options: dict[str, Any] | None,
    kwargs: dict[str, Any],
) -> Callable[..., Any]:
    for name in _INDUCTOR_ONLY:
        if kwargs.get(name) not in (None, "default"):
            logger.info(
                "%s=%r is an inductor setting: embedl backends ignore it", name, kwargs[name]
            )
        kwargs = {k: v for k, v in kwargs.items() if k != name}
    if kwargs:
        raise ValueError(
            f"embedl backends take only options={{...}}; got {sorted(kwargs)}. Valid options: "
            f"{', '.join(Settings.names())}"
        )
    settings = runtime_settings(options)
    target = backend or get_backend()
    _check_precision(target, settings)
    if aot_compile_requested():  # PyTorch's aot_compile: a callable it can save and load
        return SavedFunction.compiled_by(_compile_graph, gm, example_inputs, target, settings)
    return _compile_graph(gm, example_inputs, target, settings)


def _compile_graph(
    gm: fx.GraphModule, example_inputs: Sequence[Any], target: Backend, settings: Settings
) -> Callable[..., Any]:
    try:
        with digests_reused():  # the graph's weights are keyed before and after its rewrites
            return compile_subgraph(gm, example_inputs, target, settings)
    except EmbedlDynamoError:
        raise  # deliberate: it names the problem and the fix (bad data, a forced runtime)
    except Exception as exc:
        if settings.fallback == "raise":
            raise
        warnings.warn(
            f"embedl_{target.name}: compiling this graph failed inside embedl_dynamo "
            f"({error_line(exc)}); it runs in PyTorch. Please report this with the model",
            RuntimeWarning,
            stacklevel=4,
        )
        logger.debug("compile_subgraph failed", exc_info=True)
        return gm.forward


def _check_precision(target: Backend, settings: Settings) -> None:
    """Refuse a precision the target has no Q/DQ placement for (``embedl_lattice`` with
    ``precision="int8"``): the user's configuration to fix, not a failure inside the package.

    Raises:
        ConfigurationError: naming the precisions the target takes and the targets with INT8.
    """
    precision = settings.precision
    if not precision.quantizes or target.quantization is not None:
        return
    valid = [n for n in precision_names() if not get_precision(n).quantizes]
    with_int8 = sorted(n for n, b in discover_backends().items() if b.quantization is not None)
    raise ConfigurationError(
        f"embedl_{target.name}: precision={precision.name!r} needs the target's INT8 "
        f"quantization, and target {target.name!r} has none. Valid precisions for "
        f"embedl_{target.name}: {', '.join(valid)}; or compile for a target with INT8: "
        f"{', '.join(f'embedl_{n}' for n in with_int8)}"
    )


def embedl(
    gm: fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None = None, **kw
) -> Callable[..., Any]:
    """Dynamo backend for the active Backend (``set_backend`` / ``$EMBEDL_DYNAMO_BACKEND``)."""
    return _compile(gm, example_inputs, None, options, kw)


def make_dynamo_backend(name: str) -> Callable[..., Any]:
    """The dynamo backend function ``embedl_<name>`` for the discovered Backend ``name``."""

    def compiler(
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
        options: dict[str, Any] | None = None,
        **kw: Any,
    ) -> Callable[..., Any]:
        return _compile(gm, example_inputs, backend_by_name(name), options, kw)

    compiler.__name__ = compiler.__qualname__ = f"{_PREFIX}{name}"
    compiler.__doc__ = f"Dynamo backend compiling for the embedl_dynamo Backend {name!r}."
    return compiler


embedl_tensorrt = make_dynamo_backend("tensorrt")
embedl_onnxruntime = make_dynamo_backend("onnxruntime")
embedl_openvino = make_dynamo_backend("openvino")
embedl_lattice = make_dynamo_backend("lattice")


def __getattr__(attr: str) -> Callable[..., Any]:
    """``embedl_<name>`` for any discovered Backend (third-party targets)."""
    if attr.startswith(_PREFIX):
        name = attr[len(_PREFIX) :]
        backends = discover_backends()
        if name in backends:
            fn = make_dynamo_backend(name)
            globals()[attr] = fn
            return fn
        raise AttributeError(
            f"no embedl_dynamo Backend named {name!r} for dynamo backend {attr!r}; known: "
            f"{', '.join(_PREFIX + n for n in sorted(backends))}"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
