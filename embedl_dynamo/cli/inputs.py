"""What the command line reads from the user: shapes, ``MODULE:FACTORY`` models and their
inputs, Backends, calibration files, output and cache paths; and the exit codes with
:class:`CliError`, the one-line failure."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from embedl_dynamo.errors import CliError, error_line

__all__ = [
    "EXIT_EXPORT",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "EXIT_VERIFY",
    "INPUT_DTYPES",
    "backend_named",
    "build_model",
    "calibration_batches",
    "check_model_runs",
    "input_dtypes",
    "load_calibration",
    "load_factory",
    "model_and_inputs",
    "parse_shape",
    "random_input",
    "require_cache_writable",
    "require_writable",
]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_EXPORT = 3
EXIT_VERIFY = 4
EXIT_UNAVAILABLE = 5


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,3,224,224"`` -> ``(1, 3, 224, 224)``; a clear error for anything else."""
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(
            f"invalid input shape {text!r}; write positive sizes separated by commas, e.g. "
            "1,3,224,224"
        )
    return shape


def load_factory(spec: str) -> Any:
    """Import ``MODULE:FACTORY`` and return the factory (not yet called).

    ``MODULE`` is a dotted module name (importable from the current directory too) or a path to
    a ``.py`` file.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"model {spec!r} is not MODULE:FACTORY; e.g. examples/quickstart.py:resnet")
    if module_name.endswith(".py") or Path(module_name).is_file():
        path = Path(module_name)
        if not path.is_file():
            raise CliError(f"no such file {module_name!r}; check the path in {spec!r}")
        # a private module name: a user file called onnx.py must not shadow the onnx package
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        private = f"_embedl_dynamo_user_{digest}"
        mod_spec = importlib.util.spec_from_file_location(private, path)
        if mod_spec is None or mod_spec.loader is None:
            raise CliError(f"cannot load {module_name!r} as a Python file")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[private] = module
        try:
            mod_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[private]
            raise CliError(f"{module_name} fails to import: {type(exc).__name__}: {exc}") from exc
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.append(str(Path.cwd()))  # last: installed packages are not shadowed
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise CliError(
                f"cannot import {module_name!r} ({exc}); run from the directory that holds it or "
                "pass a .py path"
            ) from exc
    if not hasattr(module, attr):
        public = sorted(
            n for n in vars(module) if not n.startswith("_") and callable(vars(module)[n])
        )
        raise CliError(
            f"{module_name!r} has no {attr!r}; callables there: {', '.join(public[:20])}"
        )
    return getattr(module, attr)


#: the dtypes ``--input-dtype`` takes
INPUT_DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int64",
    "int32",
    "int8",
    "uint8",
    "bool",
)


def input_dtypes(names: Sequence[str] | None, count: int) -> list[str]:
    """One dtype per input from ``--input-dtype``: none given, float32; one, for every input;
    else one per ``--input-shape``.

    Raises:
        CliError: a count that is neither 1 nor the number of inputs.
    """
    names = list(names or ["float32"])
    if len(names) == 1:
        return names * count
    if len(names) != count:
        raise CliError(
            f"{len(names)} --input-dtype for {count} --input-shape; give one dtype for all "
            "inputs or one per input, in the same order"
        )
    return names


def random_input(shape: tuple[int, ...], dtype: str, generator: Any) -> Any:
    """A seeded random input: normal floats; integers in [0, 2), valid as token ids, masks and
    indices alike; random bools."""
    import torch

    kind = getattr(torch, dtype)
    if kind.is_floating_point:
        return torch.randn(shape, generator=generator).to(kind)
    if kind is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    return torch.randint(0, 2, shape, generator=generator, dtype=kind)


def check_model_runs(model: Any, inputs: Sequence[Any]) -> None:
    """Run ``model`` once in PyTorch on the CLI's random inputs.

    Raises:
        CliError: (exit 2, a usage error) the model fails on them, naming the inputs' shapes
            and dtypes and the options that set them.
    """
    import torch

    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as exc:
        given = ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in inputs)
        raise CliError(
            f"{type(model).__name__} fails in PyTorch itself on random inputs {given}: "
            f"{error_line(exc)}. Give the shape and dtype it takes: --input-shape per input and "
            "--input-dtype (e.g. int64 for token ids; float32 unless given)"
        ) from exc


def build_model(
    spec: str, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str] | None = None
) -> tuple[Any, tuple[Any, ...]]:
    """Call the factory of ``spec`` and make seeded random inputs of ``shapes`` and ``dtypes``
    (:func:`input_dtypes`; float32 when None)."""
    import torch
    from torch import nn

    factory = load_factory(spec)
    try:
        model = factory()
    except Exception as exc:
        raise CliError(
            f"{spec}() failed: {type(exc).__name__}: {exc}. The factory must build the model "
            "with no arguments"
        ) from exc
    if not isinstance(model, nn.Module):
        raise CliError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module")
    model.eval()  # our own instance: safe to switch to inference
    generator = torch.Generator().manual_seed(0)
    kinds = input_dtypes(dtypes, len(shapes))
    args = tuple(random_input(shape, kind, generator) for shape, kind in zip(shapes, kinds))
    return model, args


def model_and_inputs(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    """The model of ``args.model`` and its random inputs from ``--input-shape`` and
    ``--input-dtype``, run once in PyTorch: what every model subcommand reads, in one place.

    Raises:
        CliError: (exit 2) a factory that fails, or inputs the model rejects.
    """
    model, inputs = build_model(args.model, args.input_shape, args.input_dtype)
    check_model_runs(model, inputs)
    return model, inputs


def backend_named(name: str) -> Any:
    """The Backend ``name``, or a :class:`CliError` listing the known ones."""
    from embedl_dynamo.backend import backend_by_name

    try:
        return backend_by_name(name)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def load_calibration(path_text: str, batch: int) -> list[Any]:
    """Calibration batches from ``.npy`` (one array, split by the batch size) or ``.pt``.

    A ``.pt`` file holds a tensor (split like an array) or a list/tuple of tensors (used as the
    batches); it is read with ``torch.load(weights_only=True)``: tensors only, no pickled code.
    """
    import numpy as np
    import torch

    path = Path(path_text)
    if not path.is_file():
        raise CliError(f"calibration file {path_text!r} does not exist")
    try:
        if path.suffix == ".npy":  # floats as float32; integers (token ids) keep their type
            data: Any = torch.from_numpy(np.load(path, allow_pickle=False))
            data = data.float() if data.is_floating_point() else data
        elif path.suffix == ".pt":
            data = torch.load(path, weights_only=True, map_location="cpu")
        else:
            raise CliError(f"calibration file {path.name!r}: expected .npy or .pt")
    except CliError:
        raise
    except Exception as exc:
        raise CliError(f"cannot read calibration file {path.name!r}: {exc}") from exc
    if isinstance(data, torch.Tensor):
        if data.dim() == 0 or data.shape[0] == 0:
            raise CliError(f"calibration file {path.name!r} holds no samples")
        return list(data.split(batch))
    if isinstance(data, (list, tuple)) and data and all(isinstance(t, torch.Tensor) for t in data):
        return list(data)
    raise CliError(
        f"calibration file {path.name!r} must hold a tensor [N, ...] or a list of tensors, "
        f"not {type(data).__name__}"
    )


def require_writable(path: str | os.PathLike[str] | None, option: str, longest: str = "") -> None:
    """Fail before any work if ``path`` cannot be written (exit 3, output unwritable).

    Checks the file name's length against the file system's limit (with ``longest``, the
    longest suffix written beside it, e.g. ``.data``), that the directory exists, and that a
    file can be created in it (a trial file, removed at once).

    Raises:
        CliError: with :data:`EXIT_EXPORT`, naming the option, the problem and the fix.
    """
    if not path:
        return
    target = Path(path).expanduser()
    directory = target.parent
    if not directory.is_dir():
        raise CliError(
            f"cannot write {option} {target}: directory {directory} does not exist; create it "
            "or choose another path",
            EXIT_EXPORT,
        )
    limit = os.pathconf(directory, "PC_NAME_MAX")
    size = len(os.fsencode(target.name + longest))
    if size > limit:
        raise CliError(
            f"cannot write {option}: the file name {target.name[:40]}... is {size} bytes with "
            f"{longest or 'no suffix'}, over this file system's {limit}; choose a shorter name",
            EXIT_EXPORT,
        )
    if target.is_dir():
        raise CliError(f"cannot write {option} {target}: it is a directory", EXIT_EXPORT)
    try:
        fd, trial = tempfile.mkstemp(prefix=".embedl-dynamo-write-check.", dir=directory)
        os.close(fd)
        os.unlink(trial)
    except OSError as exc:
        raise CliError(
            f"cannot write {option} {target}: cannot write to directory {directory} "
            f"({exc.strerror or exc}); choose another path",
            EXIT_EXPORT,
        ) from exc


def calibration_batches(path_text: str, inputs: Sequence[Any]) -> list[Any]:
    """:func:`load_calibration` for a model with these ``inputs``, checked before any work:
    batches that fit the inputs (every size but the batch, and the dtype) and are finite.

    Raises:
        CliError: (exit 2) a file that cannot be read, does not fit, or holds NaN or infinity.
    """
    from embedl_dynamo.errors import CalibrationDataError
    from embedl_dynamo.quant.int8.calibrate import (
        as_batches,
        calibration_mismatch,
        check_batches_finite,
    )

    batches = load_calibration(path_text, inputs[0].shape[0] if inputs[0].dim() else 1)
    name = Path(path_text).name
    try:
        mismatch = calibration_mismatch(batches, inputs)
        if mismatch:
            raise CliError(
                f"calibration file {name!r} does not fit the model's inputs: {mismatch}; give "
                "batches shaped like --input-shape, of --input-dtype"
            )
        check_batches_finite(as_batches(batches))
    except CalibrationDataError as exc:
        raise CliError(f"calibration file {name!r}: {exc}") from exc
    return batches


def require_cache_writable(cache_dir: str | None) -> None:
    """Fail before any work if the cache a command builds cannot be written there.

    Raises:
        CliError: :data:`EXIT_EXPORT` (3) when it is read-only (``EMBEDL_DYNAMO_CACHE_READ_ONLY``,
            a read-only filesystem, permissions) or cannot be created; :data:`EXIT_USAGE` (2)
            when it is a folder of other files, not a cache, or the variable is not a yes/no.
    """
    from embedl_dynamo.cache.files import default_cache_dir, is_cache_root, read_only_reason
    from embedl_dynamo.errors import ConfigurationError

    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    try:
        reason = read_only_reason(root)
    except ConfigurationError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    fix = "build it where it can be written, then ship it to the replicas"
    if reason is not None:
        why = f"cannot build the cache in {root}: it is read-only ({reason}); {fix}"
        raise CliError(why, EXIT_EXPORT)
    if root.is_dir() and not is_cache_root(root) and any(root.iterdir()):
        raise CliError(
            f"--cache-dir {root} holds other files and is not an embedl_dynamo cache; give an "
            "empty or new directory, or an existing cache"
        )
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        fd, trial = tempfile.mkstemp(prefix=".embedl-dynamo-write-check.", dir=existing)
        os.close(fd)
        os.unlink(trial)
    except OSError as exc:
        why = f"cannot write to {existing} ({exc.strerror or exc})"
        raise CliError(f"cannot build the cache in {root}: {why}; {fix}", EXIT_EXPORT) from exc
