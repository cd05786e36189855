"""The ``embedl-dynamo`` argument parser and :func:`main`: dispatch, one-line errors, exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from embedl_dynamo.cli.commands import COMMANDS
from embedl_dynamo.cli.deploy_command import add_deploy_parser
from embedl_dynamo.cli.inputs import (
    EXIT_EXPORT,
    EXIT_INTERNAL,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_VERIFY,
    INPUT_DTYPES,
    parse_shape,
)
from embedl_dynamo.errors import (
    CalibrationDataError,
    CliError,
    ConfigurationError,
    EngineUnavailableError,
    ExportArgumentError,
    ExportError,
    NotACacheError,
    RuntimeUnavailableError,
    VerificationError,
    error_line,
)
from embedl_dynamo.precision import precision_names

__all__ = ["build_parser", "main"]


def model_args(p: argparse.ArgumentParser) -> None:
    """The arguments every model subcommand takes: the factory, inputs, target and cache."""
    p.add_argument("model", help="MODULE:FACTORY, e.g. mymodels:resnet50 or net.py:build")
    p.add_argument(
        "--input-shape",
        type=parse_shape,
        action="append",
        required=True,
        metavar="N,C,H,W",
        help="shape of a random input; repeat for several",
    )
    p.add_argument(
        "--input-dtype",
        choices=INPUT_DTYPES,
        action="append",
        metavar="DTYPE",
        help="dtype of the inputs: once for all or once per --input-shape (default "
        "float32; integers are random in [0, 2), e.g. int64 token ids)",
    )
    p.add_argument("--backend", default="tensorrt", help="target Backend (default tensorrt)")
    p.add_argument("--cache-dir", help="artifact/calibration cache (default: user cache)")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand and its options."""
    parser = argparse.ArgumentParser(
        prog="embedl-dynamo",
        description="Deploy PyTorch models: inspect backends and plans, export, benchmark.",
        epilog="exit codes: 0 ok, 1 internal error, 2 usage, 3 export failed, "
        "4 verification failed, 5 runtime unavailable",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("backends", help="discovered Backends, pattern counts and runtimes here")

    plan = sub.add_parser("plan", help="print the transformation plan table")
    model_args(plan)
    plan.add_argument("--html", help="also write the plan as a self-contained HTML page")

    export = sub.add_parser("export", help="export to ONNX (+ JSON sidecar)")
    model_args(export)
    export.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    export.add_argument(
        "--precision",
        choices=precision_names(),
        help="precision in the file (default fp32, or EMBEDL_DYNAMO_PRECISION)",
    )
    export.add_argument("--int8", action="store_true", help="same as --precision int8")
    export.add_argument("--calibration", help="calibration data, .npy or .pt (with --int8)")
    export.add_argument("--opset", type=int, help="ONNX opset (exporter default)")
    export.add_argument("--static-batch", action="store_true", help="fix the batch size")
    export.add_argument("--no-verify", action="store_true", help="keep a mismatching file")
    export.add_argument("--engine", action="store_true", help="also build a TensorRT engine")
    export.add_argument(
        "--html", action="store_true", help="also write the report page (model.html)"
    )
    export.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _triton_args(export.add_argument_group("Triton model repository"))

    _serve_args(sub.add_parser("serve", help="serve an exported file on Ray Serve (KServe v2)"))

    cache = sub.add_parser("cache", help="the artifact cache: size per namespace, or clear it")
    cache.add_argument(
        "action",
        choices=("info", "clear"),
        help="info: entries and size per namespace; clear: delete them",
    )
    cache.add_argument("--cache-dir", help="the cache root (default: user cache)")

    add_deploy_parser(sub, model_args)

    bench = sub.add_parser("bench", help="latency of eager vs compiled float vs INT8")
    model_args(bench)
    bench.add_argument(
        "--int8-backend",
        default="onnxruntime",
        help="Backend for the INT8 row (default onnxruntime: this CPU's placement)",
    )
    bench.add_argument("--no-int8", action="store_true", help="skip the INT8 row")
    bench.add_argument("--calibration", help="INT8 calibration data, .npy or .pt")
    bench.add_argument("--repeats", type=int, default=20, help="timed runs (default 20)")
    bench.add_argument("--warmup", type=int, default=3, help="untimed runs (default 3)")
    bench.add_argument("--threads", type=int, help="torch intra-op threads")
    bench.add_argument("--plot", help="write a PNG bar chart of the medians")
    return parser


def _triton_args(triton: argparse._ArgumentGroup) -> None:
    """``export``'s options for a Triton model repository written beside the file."""
    triton.add_argument(
        "--triton-repository",
        metavar="DIR",
        help="also write DIR/<name>/config.pbtxt and DIR/<name>/1/model.onnx (or model.plan)",
    )
    triton.add_argument("--triton-name", help="the model's name in Triton (default: file stem)")
    triton.add_argument("--triton-instances", type=int, default=1, help="model instances")
    triton.add_argument("--triton-threads", type=int, help="CPU threads per instance")
    triton.add_argument("--triton-max-batch", type=int, help="Triton's max_batch_size (default 8)")


def _serve_args(serve: argparse.ArgumentParser) -> None:
    """``serve``'s options: the file, where HTTP listens, replicas and their size."""
    serve.add_argument("path", help="the .onnx file embedl-dynamo export wrote")
    serve.add_argument("--name", help="the model's name in URLs (default: the file's stem)")
    serve.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    serve.add_argument("--grpc-port", type=int, help="KServe v2 gRPC port too (tritonclient.grpc)")
    serve.add_argument("--address", help="a running Ray cluster (default: start one here)")
    serve.add_argument("--replicas", type=int, default=1, help="replicas (default 1)")
    serve.add_argument("--cpus-per-replica", type=float, default=1, help="CPUs each (default 1)")
    serve.add_argument("--threads", type=int, help="runtime threads per replica (default: CPUs)")
    serve.add_argument("--max-batch", type=int, help="rows per batch (default 8)")
    serve.add_argument("--min-replicas", type=int, help="autoscale from this many replicas")
    serve.add_argument("--max-replicas", type=int, help="autoscale up to this many replicas")
    serve.add_argument(
        "--objective",
        choices=("latency", "throughput"),
        help="throughput: measure batch sizes and threads here and serve with the best",
    )
    serve.add_argument("--latency-budget-ms", type=float, help="p99 per batch (throughput)")


# the package's own errors that reach main uncaught (from inside torch.compile too), in the
# order they are matched (subclasses first), and their exit codes
_EXIT_CODES: tuple[tuple[tuple[type[Exception], ...], int], ...] = (
    ((VerificationError,), EXIT_VERIFY),
    ((EngineUnavailableError, RuntimeUnavailableError), EXIT_UNAVAILABLE),
    ((ExportArgumentError, CalibrationDataError, ConfigurationError, NotACacheError), EXIT_USAGE),
    ((ExportError,), EXIT_EXPORT),
)


def _failure(exc: Exception) -> tuple[BaseException, int]:
    """The error to name (a backend's, unwrapped from torch.compile's ``BackendCompilerFailed``)
    and its exit code: the package's own errors theirs, anything else an internal error."""
    inner = getattr(exc, "inner_exception", None)
    cause = inner if isinstance(inner, Exception) else exc
    for kinds, code in _EXIT_CODES:
        if isinstance(cause, kinds):
            return cause, code
    return cause, EXIT_INTERNAL


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring).

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage error
        return int(exc.code or 0)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # a command may run it again
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        if args.debug:  # the traceback, then the same exit code as without --debug
            traceback.print_exc()
        print(f"embedl-dynamo {args.command}: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        cause, code = _failure(exc)
        if code != EXIT_INTERNAL:
            why = error_line(cause, with_type=False)
            print(f"embedl-dynamo {args.command}: error: {why}", file=sys.stderr)
            return code
        print(
            f"embedl-dynamo {args.command}: internal error: {error_line(cause)}. "
            "Rerun with --debug for the traceback and report it.",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
