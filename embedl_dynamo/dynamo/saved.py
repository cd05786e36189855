"""Save a compiled model's forward once, start it in a new process without Dynamo's trace:
:func:`save_compiled` and :func:`load_compiled`.

They are PyTorch's own calls (``torch.compile(model.forward, backend=..., fullgraph=True)
.aot_compile(...)``, ``save_compiled_function``, ``torch.compiler.load_compiled_function``)
with what they leave to the user done here: the inputs made normal tensors and the compile run
under ``torch.no_grad()`` (a function saved under ``inference_mode`` cannot be called under it
again in torch 2.13), the model passed as external data, the artifacts optionally copied into
a bundle beside the file, the model's weights checked when it loads, and a call under another
grad or autocast state refused in one line before PyTorch's guards fail
(:mod:`~embedl_dynamo.dynamo.saved_checks`). What the saved function holds is described in
:mod:`~embedl_dynamo.dynamo.saved_function`.

The outer file is PyTorch's, which pickles Dynamo's bytecode and guards: load only files you
made, as with ``torch.load(weights_only=False)``. What embedl_dynamo adds inside it is JSON.

``aot_compile`` saves one graph: a model Dynamo cannot trace whole (a graph break, Hugging
Face's ``generate()`` loop) cannot be saved, and :func:`save_compiled` says so and what works.
"""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._dynamo.guards import CheckFunctionManager

from embedl_dynamo.dynamo.saved_checks import call_problem, model_weights, weights_problem
from embedl_dynamo.dynamo.saved_function import SavedFunction, loading, saving
from embedl_dynamo.errors import ConfigurationError, EmbedlDynamoError, SavedFunctionError
from embedl_dynamo.report.subgraph import SubgraphReport

__all__ = [
    "BUNDLE_SUFFIX",
    "LoadedFunction",
    "bundle_path",
    "load_compiled",
    "portable_guards",
    "save_compiled",
]

logger = logging.getLogger(__name__)

#: the bundle of a saved function's artifacts is the file's path with this appended
BUNDLE_SUFFIX = ".artifacts"
_WORKS = (
    "what works: torch.compile(model, backend=...) with a warm or shipped cache "
    "(docs/deployment.md), or embedl_dynamo.export(...) and load() for a file"
)


def bundle_path(path: str | Path) -> Path:
    """Where :func:`save_compiled` writes the artifacts of the function saved at ``path``."""
    return Path(str(path) + BUNDLE_SUFFIX)


def save_compiled(
    model: nn.Module,
    example_inputs: Sequence[Any] | torch.Tensor,
    path: str | Path,
    *,
    backend: str = "embedl",
    example_kwargs: dict[str, Any] | None = None,
    bundle: bool = False,
    **options: Any,
) -> Callable[..., Any]:
    """Compile ``model.forward`` for ``backend`` on ``example_inputs`` and save it to ``path``.

    Args:
        model: the model, in eval mode.
        example_inputs: the forward's positional arguments (a tensor for one).
        path: the file to write (PyTorch's format; see the module on trust).
        backend: an ``embedl_*`` dynamo backend name.
        example_kwargs: the forward's keyword arguments.
        bundle: also copy the artifacts it loads into ``<path>.artifacts`` (a cache directory
            to ship beside the file); without it they are read from the compile cache.
        options: compile options (`embedl_dynamo.settings.Settings`).

    Returns:
        The compiled function (call it under ``torch.no_grad()``).

    Raises:
        SavedFunctionError: Dynamo cannot trace the forward as one graph, or the compiled graph
            cannot be saved; the message says why and what works.

    Example:
        ```python
        embedl_dynamo.save_compiled(model, (x,), "model.compiled", backend="embedl_onnxruntime")
        fn = embedl_dynamo.load_compiled("model.compiled", model)  # in a new process
        ```
    """
    if not isinstance(model, nn.Module):
        raise SavedFunctionError(
            f"save_compiled takes an nn.Module, not {type(model).__name__}: it saves the "
            "module's forward as one graph (a generate() loop is Python around a forward: save "
            f"the forward and run the loop yourself); {_WORKS}"
        )
    if not backend.startswith("embedl"):
        raise ConfigurationError(f"backend={backend!r}: save_compiled takes an embedl_* backend")
    args = _normal(
        example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    )
    kwargs = _normal(example_kwargs or {})
    compiler_options = {**options, "guard_filter_fn": portable_guards}
    compile_options = {"backend": backend, "fullgraph": True, "options": compiler_options}

    def forward(*args: Any, **kwargs: Any) -> Any:  # called as the model is: fn(x), hooks run
        return model(*args, **kwargs)

    with torch.no_grad():
        try:
            compiled = torch.compile(forward, **compile_options).aot_compile((args, kwargs))
        except EmbedlDynamoError:
            raise
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            inner = exc.__cause__ or exc.inner_exception
            if isinstance(inner, EmbedlDynamoError):
                raise inner from exc
            raise
        except torch._dynamo.exc.Unsupported as exc:
            raise SavedFunctionError(
                f"Dynamo cannot trace {type(model).__name__}.forward as one graph, which "
                f"aot_compile needs ({_first_line(exc)}); {_WORKS}"
            ) from exc
    _modules_by_name(compiled)
    with saving(model, bundle_path(path) if bundle else None):
        compiled.save_compiled_function(str(path), external_data={"model": model})
    logger.info("saved the compiled %s.forward to %s", type(model).__name__, path)
    return compiled


def portable_guards(entries: Sequence[Any]) -> list[bool]:
    """Which of Dynamo's guards a saved function keeps: what ``aot_compile`` keeps by default
    (no global guard, none it cannot serialize), less the type-identity guards, whose ``id``
    of a class is another number in the next process (torch 2.13 keeps them, and a model class
    not imported in the same order then fails them). The model's class is checked by name
    instead (:func:`load_compiled`), its weights by digest."""
    unsupported = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [
        not (
            entry.is_global
            or entry.guard_type in unsupported
            or entry.guard_type == "TYPE_MATCH"
            or any(kind in unsupported for kind in entry.derived_guard_types)
        )
        for entry in entries
    ]


def _modules_by_name(compiled: Any) -> None:
    """Make the modules the traced bytecode reads through globals Dynamo installed
    (``___module_collections_<id>_c0``: a Hugging Face decoder's output) imported by name when
    the function loads: torch 2.13 saves them neither by name nor by value, and the load fails
    with "Missing required external references"."""
    artifacts = getattr(compiled, "_artifacts", None)
    env = getattr(artifacts, "runtime_env", None)
    f_globals = getattr(compiled, "_extra_globals", None) or {}
    if env is None or not hasattr(env, "external_refs"):
        return  # another torch: its own save says what is missing
    known = {*env.used_globals, *env.import_sources}
    modules = {
        ref: f_globals[ref].__name__
        for ref in env.external_refs
        if ref not in known and isinstance(f_globals.get(ref), types.ModuleType)
    }
    if modules:
        sources = {**env.import_sources, **modules}
        artifacts.runtime_env = dataclasses.replace(env, import_sources=sources)


def _normal(value: Any) -> Any:
    """``value`` with every inference tensor copied to a normal one: PyTorch's saved guards
    record the dispatch keys of what was traced, and a loaded function is called on normal
    tensors under ``no_grad``."""
    return torch.utils._pytree.tree_map(
        lambda t: _copy(t) if isinstance(t, torch.Tensor) and t.is_inference() else t, value
    )


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode(False):
        return tensor.clone()


def _first_line(exc: BaseException) -> str:
    return next(
        (line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__
    )


def load_compiled(
    path: str | Path, model: nn.Module, *, cache_dir: str | Path | None = None
) -> LoadedFunction:
    """Load what [save_compiled][embedl_dynamo.save_compiled] wrote: no Dynamo trace, and on
    the first call no pipeline stage (each artifact is loaded from the bundle beside the file,
    ``cache_dir``, or the compile cache).

    Args:
        path: the saved file (only files you made: see the module).
        model: the model it was saved from, with the same weights.
        cache_dir: the cache (or bundle) to read the artifacts from; default: the bundle
            beside ``path`` when there is one, else the compile cache.

    Returns:
        The function: call it like ``model.forward`` under ``torch.no_grad()``.

    Raises:
        SavedFunctionError: the file was not saved by an embedl backend, the model's weights
            are not the saved ones, or an artifact is missing or not the one saved.

    Example:
        ```python
        fn = embedl_dynamo.load_compiled("model.compiled", model)  # no Dynamo trace
        y = fn(x)
        ```
    """
    if cache_dir is None and bundle_path(path).is_dir():
        cache_dir = bundle_path(path)
    with (
        loading(Path(cache_dir) if cache_dir is not None else None) as loaded,
        open(path, "rb") as f,
    ):
        fn = torch.compiler.load_compiled_function(f, external_data={"model": model})
    if len(loaded) != 1:
        raise SavedFunctionError(
            f"{path} is not a compiled function saved by an embedl_* backend "
            f"({len(loaded)} embedl graphs in it); save it with embedl_dynamo.save_compiled"
        )
    saved = loaded[0]
    _check_model(saved, model)
    saved.artifacts_dir()  # every artifact is there, with its digest: said now, not at a call
    return LoadedFunction(fn, saved)


def _check_model(saved: SavedFunction, model: nn.Module) -> None:
    """Refuse a model of another class, or whose weights are not the saved ones (where the
    file names them)."""
    saved_class = saved.record.get("model_class")
    if saved_class is not None and type(model).__qualname__ != saved_class:
        raise SavedFunctionError(
            f"this saved compiled function was saved from a {saved_class}, not a "
            f"{type(model).__qualname__}: load it with the model it was saved from"
        )
    record = saved.record["weights"]
    names = record.get("state_names")
    if not names:
        return  # saved by PyTorch's own call: checked on the first call, by position
    tensors = model_weights(model, names)
    problem = tensors if isinstance(tensors, str) else weights_problem(record, tensors)
    if problem is not None:
        raise SavedFunctionError(
            f"this saved compiled function cannot run on this model: {problem}. Load it with "
            "the weights it was saved with, or save it again for these weights"
        )


class LoadedFunction:
    """A loaded compiled function: PyTorch's, with each call's grad and autocast state and
    inputs checked first (:func:`~embedl_dynamo.dynamo.saved_checks.call_problem`)."""

    def __init__(self, fn: Callable[..., Any], saved: SavedFunction) -> None:
        self._fn = fn
        self._saved = saved

    @property
    def report(self) -> SubgraphReport | None:
        """What its first call loaded (None before it)."""
        return self._saved.report

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        problem = call_problem(self._saved.record["state"], args, kwargs)
        if problem is not None:
            raise SavedFunctionError(
                f"this saved compiled function cannot take this call: {problem}"
            )
        return self._fn(*args, **kwargs)
