"""embedl_dynamo: deploy PyTorch models to inference hardware through ``torch.compile``.

``torch.compile(model, backend="embedl_tensorrt")`` runs conversions, fusions and (optionally)
INT8 quantization on the Dynamo graph and hands it to ONNX Runtime, TensorRT or Torch-TensorRT.
``export``/``load`` do the same ahead of time; ``transform``, ``quantize`` and ``prepare_qat``
run the stages on a plain module. Every error the package raises on purpose is an
:class:`EmbedlDynamoError` (:mod:`embedl_dynamo.errors`).
"""

from __future__ import annotations

from embedl_dynamo.backend import (
    Backend,
    discover_backends,
    get_backend,
    reset_backends,
    set_backend,
)
from embedl_dynamo.cache.files import wait_for_cache_writes
from embedl_dynamo.deploy.export import export
from embedl_dynamo.deploy.load import load
from embedl_dynamo.deploy.refit import refit
from embedl_dynamo.dynamo.coverage import CoverageReport, KeptOp, coverage
from embedl_dynamo.dynamo.saved import load_compiled, save_compiled
from embedl_dynamo.errors import (
    CacheLockTimeoutError,
    CalibrationDataError,
    CallRefused,
    CliError,
    ConfigurationError,
    CorruptEntryError,
    EmbedlDynamoError,
    EngineUnavailableError,
    ExportArgumentError,
    ExportError,
    IndexGuardError,
    KServeError,
    NonFiniteError,
    NotACacheError,
    OutputMismatchError,
    ReadOnlyCacheError,
    RuntimeUnavailableError,
    SavedFunctionError,
    VerificationError,
    WeightsChangedWhileWritingError,
)
from embedl_dynamo.pipeline import prepare_qat, quantize
from embedl_dynamo.report.record import clear_reports, explain, last_report
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.plan import PatternMatch, TransformationPlan
from embedl_dynamo.rewrite.qdq import QDQ, FusedModule, Role
from embedl_dynamo.transform import (
    TransformResult,
    apply_transformation_plan,
    get_transformation_plan,
    trace,
    transform,
)

__version__ = "0.1.0"

__all__ = [
    "CacheLockTimeoutError",
    "CoverageReport",
    "KeptOp",
    "coverage",
    "CalibrationDataError",
    "CallRefused",
    "CliError",
    "ConfigurationError",
    "CorruptEntryError",
    "EmbedlDynamoError",
    "EngineUnavailableError",
    "ExportArgumentError",
    "ExportError",
    "IndexGuardError",
    "KServeError",
    "NonFiniteError",
    "NotACacheError",
    "OutputMismatchError",
    "ReadOnlyCacheError",
    "RuntimeUnavailableError",
    "SavedFunctionError",
    "WeightsChangedWhileWritingError",
    "VerificationError",
    "QDQ",
    "Backend",
    "FusedModule",
    "Match",
    "MatchResult",
    "Pattern",
    "PatternMatch",
    "Role",
    "TransformResult",
    "TransformationPlan",
    "apply_transformation_plan",
    "clear_reports",
    "discover_backends",
    "explain",
    "export",
    "get_backend",
    "get_transformation_plan",
    "last_report",
    "load",
    "load_compiled",
    "prepare_qat",
    "quantize",
    "refit",
    "reset_backends",
    "save_compiled",
    "set_backend",
    "trace",
    "transform",
    "wait_for_cache_writes",
]
