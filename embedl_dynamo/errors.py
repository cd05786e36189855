"""Every public exception of the package, under one base, and how an error is named in one line.

``except EmbedlDynamoError`` catches any failure the package raises on purpose. Each class keeps
the builtin base its callers rely on (``ExportArgumentError`` and ``CalibrationDataError`` are
``ValueError``, as is ``ConfigurationError``; ``ExportError``, ``RuntimeUnavailableError``, ``OutputMismatchError`` and
``CorruptEntryError`` are ``RuntimeError``). This module imports nothing from the package.
"""

from __future__ import annotations

__all__ = [
    "CacheLockTimeoutError",
    "CallRefused",
    "CalibrationDataError",
    "CliError",
    "ConfigurationError",
    "CorruptEntryError",
    "EmbedlDynamoError",
    "EngineUnavailableError",
    "ExportArgumentError",
    "ExportError",
    "IndexGuardError",
    "NonFiniteError",
    "KServeError",
    "NotACacheError",
    "OutputMismatchError",
    "ReadOnlyCacheError",
    "RuntimeUnavailableError",
    "SavedFunctionError",
    "VerificationError",
    "WeightsChangedWhileWritingError",
    "error_line",
]


class EmbedlDynamoError(Exception):
    """The base of every exception the package raises on purpose; the message names the fix.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.ExportError, embedl_dynamo.EmbedlDynamoError)
        True
    """


class ConfigurationError(EmbedlDynamoError, ValueError):
    """A setting (an option or an ``EMBEDL_DYNAMO_*`` environment variable) has a value the
    package cannot use; the message names the setting, the value and the valid forms.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.ConfigurationError, (embedl_dynamo.EmbedlDynamoError, ValueError))
        True
    """


class CacheLockTimeoutError(EmbedlDynamoError, TimeoutError):
    """Another process held a cache entry's lock longer than the lock timeout; the caller
    builds without the cache instead of waiting on.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.CacheLockTimeoutError, (embedl_dynamo.EmbedlDynamoError, TimeoutError))
        True
    """


class CorruptEntryError(EmbedlDynamoError, RuntimeError):
    """A cache entry's bytes do not match its sidecar; the entry has been removed.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.CorruptEntryError, (embedl_dynamo.EmbedlDynamoError, RuntimeError))
        True
    """


class ReadOnlyCacheError(EmbedlDynamoError, PermissionError):
    """A write to a cache that is only read (shipped to replicas, mounted read-only).

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.ReadOnlyCacheError, (embedl_dynamo.EmbedlDynamoError, PermissionError))
        True
    """


class KServeError(EmbedlDynamoError, ValueError):
    """A served request the KServe v2 protocol or the model cannot take (HTTP 400 with it).

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.KServeError, (embedl_dynamo.EmbedlDynamoError, ValueError))
        True
    """


class CallRefused(EmbedlDynamoError, ValueError):
    """A per-call guard sent this call to PyTorch, whatever ``fallback`` says: a runtime would
    answer it otherwise than PyTorch (a NaN input through OpenVINO's ReLU, an fp16 overflow,
    int64 values past int32 on OpenVINO). The message says why; the caller never sees it.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.CallRefused, (embedl_dynamo.EmbedlDynamoError, ValueError))
        True
    """


class IndexGuardError(CallRefused):
    """An index of this call is outside the range PyTorch takes in an op a runtime computes
    (`embedl_dynamo.graph.index_guards`): the call runs in PyTorch, which raises.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.IndexGuardError, (embedl_dynamo.CallRefused,))
        True
    """


class NotACacheError(EmbedlDynamoError, ValueError):
    """A directory to clear holds no marker of an embedl_dynamo cache; nothing was deleted.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.NotACacheError, (embedl_dynamo.EmbedlDynamoError, ValueError))
        True
    """


class CalibrationDataError(EmbedlDynamoError, ValueError):
    """The calibration data cannot calibrate this graph; the message says why and the fix.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.CalibrationDataError, (embedl_dynamo.EmbedlDynamoError, ValueError))
        True
    """


class NonFiniteError(CalibrationDataError):
    """Calibration data holds NaN or infinity.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.NonFiniteError, (embedl_dynamo.CalibrationDataError,))
        True
    """


class ExportError(EmbedlDynamoError, RuntimeError):
    """The graph could not be exported to ONNX; the message names the op when known.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.ExportError, (embedl_dynamo.EmbedlDynamoError, RuntimeError))
        True
    """


class ExportArgumentError(ExportError, ValueError):
    """A bad argument to [export][embedl_dynamo.export] (model, inputs, path, backend, options).

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.ExportArgumentError, (embedl_dynamo.ExportError, ValueError))
        True
    """


class VerificationError(ExportError):
    """The exported file does not reproduce PyTorch's outputs within tolerance.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.VerificationError, (embedl_dynamo.ExportError,))
        True
    """


class EngineUnavailableError(ExportError):
    """``engine=True`` where TensorRT or a CUDA GPU is missing.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.EngineUnavailableError, (embedl_dynamo.ExportError,))
        True
    """


class RuntimeUnavailableError(EmbedlDynamoError, RuntimeError):
    """A runtime was asked for but cannot run here; the message names what is missing.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.RuntimeUnavailableError, (embedl_dynamo.EmbedlDynamoError, RuntimeError))
        True
    """


class OutputMismatchError(EmbedlDynamoError, RuntimeError):
    """A built artifact's outputs differ from the GraphModule's on the build sample.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.OutputMismatchError, (embedl_dynamo.EmbedlDynamoError, RuntimeError))
        True
    """


class SavedFunctionError(EmbedlDynamoError, RuntimeError):
    """A compiled function cannot be saved or loaded as asked (a graph break, other weights, a
    missing artifact, another grad or autocast state); the message says why and what works.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.SavedFunctionError, (embedl_dynamo.EmbedlDynamoError, RuntimeError))
        True
    """


class WeightsChangedWhileWritingError(EmbedlDynamoError, RuntimeError):
    """A weight was modified in place while its ONNX file was being written from the tensors'
    memory: the file would hold neither set of weights, so it is not stored (a refit of the
    new weights takes the export kept in memory instead). Raised on the writer's thread and
    logged; a caller sees it only where it waits for that write.

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.WeightsChangedWhileWritingError, RuntimeError)
        True
    """


class CliError(EmbedlDynamoError):
    """A user-facing failure of the command line: one line of cause and fix, and the exit code.

    Args:
        message: the cause and the fix, one line.
        code: the process exit code (`embedl_dynamo.cli` lists them; 2, a usage error, by
            default).

    Example:
        >>> import embedl_dynamo
        >>> issubclass(embedl_dynamo.CliError, (embedl_dynamo.EmbedlDynamoError,))
        True
    """

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def error_line(exc: BaseException, *, with_type: bool = True, skip: tuple[str, ...] = ()) -> str:
    """An exception named in one line, as reports, warnings and error messages show it.

    Args:
        exc: the exception.
        with_type: ``Type: first line`` (``Type`` alone for an empty message); without it, the
            first line alone (the type's name for an empty message).
        skip: prefixes of lines that say nothing about the cause (OpenVINO's
            ``Exception from src/...cpp:117:``); the first other line is shown, if any.

    Returns:
        The first non-blank line of the message (after ``skip``), stripped.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if not line.startswith(skip)]
    first = (causes or lines or [""])[0]
    name = type(exc).__name__
    if not with_type:
        return first or name
    return f"{name}: {first}" if first else name
