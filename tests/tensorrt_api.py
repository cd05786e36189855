"""NVIDIA's real TensorRT 11.0 Python bindings on a machine without a GPU, and a proxy that holds
every call our code makes to their real signatures.

The ``tensorrt-cu13-bindings==11.0.0.114`` wheel is the real binding module (``tensorrt_bindings``).
It imports once ``libnvinfer.so.11``, ``libnvinfer_plugin.so.11`` and ``libnvonnxparser.so.11``
resolve: :func:`load_bindings` builds three stand-in libraries with the system C compiler that
export the ten C symbols the module links against (factories return NULL, versions 11.0), loads
them by soname, and imports the module. Every class, enum, property and method signature is then
NVIDIA's; only creating a Builder or Runtime fails (the factories return NULL).

:class:`ValidatingTensorRT` stands for the ``tensorrt`` module in our code. Enums, ``Logger`` and
constants are the real ones. Builder/OnnxParser/Runtime and the objects they return are
:class:`Bound` proxies: an attribute that the real class lacks raises, a method call must bind to
one of the real pybind11 overloads (parameter names, count, and argument types for ints, strings,
shapes and TensorRT classes), the result is typed by the real return annotation, and only then is
the scripted stand-in (``fakes``) asked for a value. ``calls`` records ``Class.method`` in order.

Install (see the README's set-up)::

    pip install --no-deps --target .venv/tensorrt-proof -r tests/tensorrt-proof-requirements.txt
"""

from __future__ import annotations

import ctypes
import inspect
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

PROOF_DIR = Path(sys.prefix) / "tensorrt-proof"
INSTALL = (
    "pip install --no-deps --target .venv/tensorrt-proof -r tests/tensorrt-proof-requirements.txt"
)

# the C symbols the binding module and Torch-TensorRT's Python package link against
_STAND_INS = {
    "libnvinfer.so.11": (
        "void* createInferBuilder_INTERNAL(void* l, int v) { return 0; }\n"
        "void* createInferRefitter_INTERNAL(void* e, void* l, int v) { return 0; }\n"
        "void* createInferRuntime_INTERNAL(void* l, int v) { return 0; }\n"
        "void* getBuilderPluginRegistry(int c) { return 0; }\n"
        "void* getPluginRegistry(void) { return 0; }\n"
        "int getInferLibVersion(void) { return 110000; }\n"
    ),
    "libnvinfer_plugin.so.11": "int initLibNvInferPlugins(void* l, const char* n) { return 1; }\n",
    "libnvonnxparser.so.11": (
        "void* createNvOnnxParser_INTERNAL(void* n, void* l, int v) { return 0; }\n"
        "void* createNvOnnxParserRefitter_INTERNAL(void* r, void* l, int v) { return 0; }\n"
        "int getNvOnnxParserVersion(void) { return 11000; }\n"
    ),
}


def load_bindings(build_dir: Path) -> types.ModuleType:
    """The real ``tensorrt_bindings`` module over stand-in libraries (skips with the reason and
    the install command when the wheel or a C compiler is missing)."""
    if not (PROOF_DIR / "tensorrt_bindings").is_dir():
        pytest.skip(f"TensorRT's bindings are not installed for the CPU proofs: {INSTALL}")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in TensorRT libraries")
    for soname, source in _STAND_INS.items():
        c_file, library = build_dir / f"{soname}.c", build_dir / soname
        c_file.write_text(source)
        subprocess.run(
            [compiler, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", library, c_file],
            check=True,
        )
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)  # satisfies DT_NEEDED by soname
    sys.path.insert(0, str(PROOF_DIR))  # only while importing: torch_tensorrt lies there too
    try:
        import tensorrt_bindings
    finally:
        sys.path.remove(str(PROOF_DIR))
    return tensorrt_bindings


# ----------------------------------------------------------------------------------------------
# the real signatures, read from pybind11's docstrings


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "[(<":
            depth += 1
        elif char in "])>":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def overloads(function: Any, name: str) -> list[tuple[list[tuple[str, str, bool]], str]]:
    """``[(params, return_annotation)]`` per pybind11 overload; params are (name, annotation,
    has_default) without ``self``."""
    found = []
    for line in (function.__doc__ or "").splitlines():
        match = re.match(rf"^(?:\d+\. )?{re.escape(name)}\((.*)\) -> (.+)$", line.strip())
        if not match or match.group(1) == "*args, **kwargs":
            continue
        params = []
        for part in _split_top_level(match.group(1))[1:]:  # drop self
            head, _, default = part.partition(" = ")
            param, _, annotation = head.partition(": ")
            params.append((param.strip(), annotation.strip(), bool(default)))
        found.append((params, match.group(2).strip()))
    return found


def _class_name(annotation: str) -> str | None:
    match = re.fullmatch(r"tensorrt_bindings\.tensorrt\.(\w+(?:\.\w+)?)", annotation)
    return match.group(1) if match else None


def _accepts(trt: types.ModuleType, annotation: str, value: Any) -> bool:
    if annotation in ("typing.SupportsInt", "int"):
        return isinstance(value, int) or hasattr(value, "__index__")
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "bool":
        return isinstance(value, bool)
    if annotation == "typing_extensions.Buffer":
        return isinstance(value, bytes | bytearray | memoryview)
    if annotation in ("tuple", "list"):
        return isinstance(value, tuple if annotation == "tuple" else list)
    name = _class_name(annotation)
    if name == "Dims":
        return isinstance(value, tuple | list) and all(isinstance(d, int) for d in value)
    if name is not None:
        real = getattr(trt, name.split(".")[0])
        for part in name.split(".")[1:]:
            real = getattr(real, part)
        if isinstance(value, Bound):
            return issubclass(value.real_class, real)
        return isinstance(value, real)
    return True  # an annotation we do not check


class SignatureError(TypeError):
    """A call that binds to none of the real TensorRT overloads."""


def bind(trt: types.ModuleType, real_class: type, method: str, args, kwargs) -> str:
    """The return annotation of the first real overload ``args``/``kwargs`` bind to."""
    function = getattr(real_class, method)
    options = overloads(function, method)
    if not options:
        raise SignatureError(f"{real_class.__name__}.{method} has no readable signature")
    reasons = []
    for params, returns in options:
        parameters = [
            inspect.Parameter(
                n,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=None if d else inspect.Parameter.empty,
            )
            for n, _, d in params
        ]
        try:
            bound = inspect.Signature(parameters).bind(*args, **kwargs)
        except TypeError as exc:
            reasons.append(str(exc))
            continue
        annotations = {n: a for n, a, _ in params}
        wrong = [n for n, v in bound.arguments.items() if not _accepts(trt, annotations[n], v)]
        if not wrong:
            return returns
        reasons.append(f"{wrong} do not fit {[annotations[n] for n in wrong]}")
    raise SignatureError(f"{real_class.__name__}.{method}{tuple(args)} fits no overload: {reasons}")


# ----------------------------------------------------------------------------------------------
# the proxy


class Bound:
    """A TensorRT object: the real class's API, the scripted stand-in's values."""

    def __init__(self, api: ValidatingTensorRT, real_class: type, fake: Any) -> None:
        object.__setattr__(self, "real_class", real_class)
        object.__setattr__(self, "_api", api)
        object.__setattr__(self, "_fake", fake)

    def __getattr__(self, name: str) -> Any:
        real_class, api = self.real_class, self._api
        try:
            static = inspect.getattr_static(real_class, name)
        except AttributeError:
            raise AttributeError(f"TensorRT 11's {real_class.__name__} has no {name!r}") from None
        if isinstance(static, property):
            api.calls.append(f"{real_class.__name__}.{name}")
            returns = (static.fget.__doc__ or "").rpartition("-> ")[2].strip()
            return api.typed(returns, getattr(self._fake, name), f"{real_class.__name__}.{name}")

        def call(*args, **kwargs):
            returns = bind(api.trt, real_class, name, args, kwargs)
            api.calls.append(f"{real_class.__name__}.{name}")
            value = getattr(self._fake, name)(*args, **kwargs)
            return api.typed(returns, value, f"{real_class.__name__}.{name}")

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        static = inspect.getattr_static(self.real_class, name, None)
        if not isinstance(static, property) or static.fset is None:
            raise AttributeError(f"TensorRT 11's {self.real_class.__name__}.{name} is not settable")
        setattr(self._fake, name, value)


class ValidatingTensorRT(types.ModuleType):
    """Stands for ``import tensorrt``: the real module's names, calls checked against it.

    Args:
        trt: the real binding module.
        fakes: class name -> factory of the scripted object for each class our code creates
            (``Builder``, ``OnnxParser``, ``Runtime``); the objects they return are typed by
            the real annotations.
    """

    def __init__(self, trt: types.ModuleType, fakes: Mapping[str, Callable[..., Any]]) -> None:
        super().__init__("tensorrt")
        self.trt, self.fakes, self.calls = trt, dict(fakes), []
        self.__version__ = trt.__version__

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.trt, name)
        if name not in self.fakes:
            return real  # enums, Logger, dtype constants: the real objects

        def construct(*args, **kwargs):
            bind(self.trt, real, "__init__", args, kwargs)
            self.calls.append(f"{name}.__init__")
            return Bound(self, real, self.fakes[name](*args, **kwargs))

        return construct

    def typed(self, annotation: str, value: Any, where: str) -> Any:
        """``value`` as the real API would return it (a :class:`Bound` for TensorRT classes)."""
        name = _class_name(annotation)
        if annotation == "None" or value is None:
            return value
        if name == "Dims":
            assert isinstance(value, tuple), f"{where} returns Dims, the stand-in gave {value!r}"
            return value
        if name == "IHostMemory":  # exposes the buffer protocol
            assert isinstance(value, bytes), f"{where} returns a buffer"
            return value
        if name is not None and hasattr(self.trt, name):
            real = getattr(self.trt, name)
            if isinstance(value, real):  # an enum value, returned as is
                return value
            return Bound(self, real, value)
        expected = {"int": int, "bool": bool, "str": str}.get(annotation)
        if expected is not None:
            assert isinstance(value, expected), f"{where} returns {annotation}, got {value!r}"
        return value


# ----------------------------------------------------------------------------------------------
# Torch-TensorRT's own Python package


def import_torch_tensorrt(trt: types.ModuleType, copy_dir: Path, patch: pytest.MonkeyPatch):
    """Torch-TensorRT 2.13's real Python package on CPU.

    Its native ``_C``/``lib/*.so`` (they need libtorch CUDA) are left out of a copy of the
    package, ``import tensorrt`` gives the real bindings, and the CUDA device queries it makes
    at import and compile time answer as one H100 would. ``patch`` undoes all of it.
    """
    import torch

    source = PROOF_DIR / "torch_tensorrt"
    if not source.is_dir():
        pytest.skip(f"Torch-TensorRT's package is not installed for the CPU proofs: {INSTALL}")
    package = copy_dir / "torch_tensorrt"
    if not package.is_dir():
        shutil.copytree(source, package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    patch.syspath_prepend(str(PROOF_DIR))  # its pure-Python dependencies (dllist, psutil)
    patch.syspath_prepend(str(copy_dir))  # first: the copy without native libraries
    patch.setitem(sys.modules, "tensorrt", trt)
    properties = types.SimpleNamespace(
        major=9, minor=0, name="stand-in H100", total_memory=80 << 30, multi_processor_count=132
    )
    patch.setattr(torch.cuda, "current_device", lambda: 0)
    patch.setattr(torch.cuda, "device_count", lambda: 1)
    patch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    patch.setattr(torch.cuda, "get_device_name", lambda device=None: properties.name)
    patch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    patch.setattr(torch._C, "_CudaDeviceProperties", type("CudaDeviceProperties", (), {}), False)
    import torch_tensorrt

    return torch_tensorrt


def forget_modules(prefixes: tuple[str, ...]) -> None:
    """Drop imported modules (after a proof) so later tests import afresh."""
    for name in [n for n in sys.modules if n.split(".")[0] in prefixes]:
        del sys.modules[name]
