"""The ``embedl-dynamo`` command line: backends, plan, export, bench.

::

    embedl-dynamo backends
    embedl-dynamo plan  MODULE:FACTORY --input-shape 1,3,224,224 [--backend tensorrt]
    embedl-dynamo export MODULE:FACTORY --input-shape 1,3,224,224 -o model.onnx \\
        [--int8 --calibration batches.npy|.pt] [--engine] [--no-verify]
    embedl-dynamo bench MODULE:FACTORY --input-shape 1,3,224,224 [--plot latency.png]

``MODULE`` is an importable module (``torchvision.models``) or a ``.py`` file; ``FACTORY`` a
function or class in it called with no arguments that returns the ``nn.Module``. Inputs are
random tensors of the given shapes (repeat ``--input-shape`` for several inputs).

Errors print one line, the cause and the fix, and no traceback unless ``--debug``. Exit codes:

====  =================================================================================
0     success
1     internal error (a bug: rerun with ``--debug`` and report it)
2     usage error: bad arguments, unknown backend, factory not found, bad calibration file
3     the model cannot be captured, transformed or exported
4     the exported file does not match PyTorch within tolerance (``--no-verify`` keeps it)
5     a required runtime is unavailable here (TensorRT / CUDA for ``--engine``)
====  =================================================================================
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "EXIT_EXPORT",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "EXIT_VERIFY",
    "CliError",
    "load_factory",
    "main",
    "parse_shape",
]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_EXPORT = 3
EXIT_VERIFY = 4
EXIT_UNAVAILABLE = 5


class CliError(Exception):
    """A user-facing failure: one line of cause and fix, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


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
        mod_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[path.stem] = module
        mod_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
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


def _build_model(spec: str, shapes: Sequence[tuple[int, ...]]) -> tuple[Any, tuple[Any, ...]]:
    import torch
    from torch import nn

    factory = load_factory(spec)
    model = factory()
    if not isinstance(model, nn.Module):
        raise CliError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module")
    model.eval()  # our own instance: safe to switch to inference
    generator = torch.Generator().manual_seed(0)
    args = tuple(torch.randn(shape, generator=generator) for shape in shapes)
    return model, args


def _backend(name: str) -> Any:
    from embedl_dynamo.backend import backend_by_name

    try:
        return backend_by_name(name)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def _load_calibration(path_text: str, batch: int) -> list[Any]:
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
        if path.suffix == ".npy":
            data: Any = torch.from_numpy(np.load(path, allow_pickle=False)).float()
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


def _cmd_backends(args: argparse.Namespace) -> int:
    from embedl_dynamo.backend import discover_backends
    from embedl_dynamo.runtimes import RUNTIME_CLASSES

    backends = discover_backends()
    if not backends:
        print("no embedl_dynamo backends are installed")
    rows = [("backend", "conversion", "fusion", "smooth", "quantized", "int8", "dynamo backend")]
    for name in sorted(backends):
        b = backends[name]
        rows.append(
            (
                name,
                str(len(b.conversion_patterns)),
                str(len(b.fusion_patterns)),
                str(len(b.smooth_patterns)),
                str(len(b.quantized_patterns)),
                "yes" if b.quantization is not None else "no",
                f"embedl_{name}",
            )
        )
    print(_table(rows))
    for name in sorted(backends):
        if backends[name].description:
            print(f"  {name}: {backends[name].description}")
    print()
    rows = [("runtime", "available", "why not")]
    for name, cls in RUNTIME_CLASSES.items():
        missing = cls.missing()
        rows.append((name, "yes" if missing is None else "no", missing or ""))
    print(_table(rows))
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    from embedl_dynamo.graph.capture import capture
    from embedl_dynamo.pipeline import run_pipeline

    backend = _backend(args.backend)
    model, inputs = _build_model(args.model, args.input_shape)
    try:
        result = run_pipeline(capture(model, inputs), inputs, backend)
    except RuntimeError as exc:
        raise CliError(f"{exc}", EXIT_EXPORT) from exc
    print(result.plan)
    summary = result.plan.summary()
    print(
        f"\n{summary['applied_count']} applied, {summary['skipped_count']} skipped "
        f"(backend {backend.name}); disable entries by glob with plan.disable('<id glob>')"
    )
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    import json

    from embedl_dynamo.deploy.export import (
        EngineUnavailableError,
        ExportArgumentError,
        ExportError,
        VerificationError,
        export,
        sidecar_path,
    )

    _backend(args.backend)
    if args.calibration and not args.int8:
        raise CliError("--calibration is only used with --int8; add --int8 or drop it")
    model, inputs = _build_model(args.model, args.input_shape)
    calibration = (
        _load_calibration(args.calibration, inputs[0].shape[0]) if args.calibration else None
    )
    options: dict[str, Any] = {}
    if args.cache_dir:
        options["cache_dir"] = args.cache_dir
    try:
        path = export(
            model,
            inputs,
            args.output,
            backend=args.backend,
            quantize="int8" if args.int8 else None,
            calibration_data=calibration,
            dynamic_batch=not args.static_batch,
            opset=args.opset,
            verify=not args.no_verify,
            engine=args.engine,
            options=options,
            progress=not args.quiet,
        )
    except VerificationError as exc:
        raise CliError(str(exc), EXIT_VERIFY) from exc
    except EngineUnavailableError as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from exc
    except ExportArgumentError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except ExportError as exc:
        raise CliError(str(exc), EXIT_EXPORT) from exc
    side = json.loads(sidecar_path(path).read_text())
    check = side["verification"]
    print(f"wrote {path} and {sidecar_path(path).name}")
    print(
        f"  {side['plan']['applied_count']} plan entries applied, "
        f"{'INT8 QDQ' if side['quantized'] else 'float'}, "
        f"max abs diff {check['max_abs_diff']:.3g} vs {check['compared_with']} "
        f"(tolerance {check['tolerance']:.3g})"
    )
    if side["quantized"]:
        print(
            f"  {len(side['quantization']['float_layers'])} layers left in float "
            f"(see {sidecar_path(path).name}); cosine to float {check['cosine_to_float']:.5f}"
        )
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from embedl_dynamo.deploy.benchmark import format_table, measure, plot_latencies

    _backend(args.backend)
    if not args.no_int8:
        _backend(args.int8_backend)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, inputs = _build_model(args.model, args.input_shape)
    cache = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    with torch.no_grad():
        reference = model(*inputs)
    reference = [reference] if isinstance(reference, torch.Tensor) else list(reference)
    kw = {"warmup": args.warmup, "repeats": args.repeats, "reference": reference}
    from embedl_dynamo.report import clear_reports, last_report

    rows = [measure("eager", model, inputs, **kw)]
    notes = []
    torch._dynamo.reset()
    clear_reports()
    compiled = torch.compile(model, backend=f"embedl_{args.backend}", options=dict(cache))
    rows.append(measure(f"embedl_{args.backend} float", compiled, inputs, **kw))
    notes.append(f"{rows[-1].name}: {last_report()}")
    if not args.no_int8:
        torch._dynamo.reset()
        calibration = (
            _load_calibration(args.calibration, inputs[0].shape[0])
            if args.calibration
            else [tuple(torch.randn_like(t) for t in inputs) for _ in range(8)]
        )
        options = {**cache, "quantize": "int8", "calibration_data": calibration}
        clear_reports()
        int8 = torch.compile(model, backend=f"embedl_{args.int8_backend}", options=options)
        rows.append(measure(f"embedl_{args.int8_backend} int8", int8, inputs, **kw))
        notes.append(f"{rows[-1].name}: {last_report()}")
    shapes = " ".join("x".join(map(str, s)) for s in args.input_shape)
    print(f"{args.model}  input {shapes}  threads {torch.get_num_threads()}  "
          f"medians over {args.repeats} runs")  # fmt: skip
    print(format_table(rows, baseline="eager"))
    for note in notes:  # where each compiled variant really ran (eager fallbacks show here)
        print(f"  {note}")
    if args.plot:
        plot_latencies(rows, args.plot, title=f"{args.model} ({shapes})")
        print(f"wrote {args.plot}")
    return EXIT_OK


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedl-dynamo",
        description="Deploy PyTorch models: inspect backends and plans, export, benchmark.",
        epilog="exit codes: 0 ok, 1 internal error, 2 usage, 3 export failed, "
        "4 verification failed, 5 runtime unavailable",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("backends", help="discovered Backends, pattern counts and runtimes here")

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="MODULE:FACTORY, e.g. mymodels:resnet50 or net.py:build")
        p.add_argument(
            "--input-shape",
            type=parse_shape,
            action="append",
            required=True,
            metavar="N,C,H,W",
            help="shape of a random input; repeat for several",
        )
        p.add_argument("--backend", default="tensorrt", help="target Backend (default tensorrt)")
        p.add_argument("--cache-dir", help="artifact/calibration cache (default: user cache)")

    plan = sub.add_parser("plan", help="print the transformation plan table")
    model_args(plan)

    export = sub.add_parser("export", help="export to ONNX (+ JSON sidecar)")
    model_args(export)
    export.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    export.add_argument("--int8", action="store_true", help="INT8 QDQ export")
    export.add_argument("--calibration", help="calibration data, .npy or .pt (with --int8)")
    export.add_argument("--opset", type=int, help="ONNX opset (exporter default)")
    export.add_argument("--static-batch", action="store_true", help="fix the batch size")
    export.add_argument("--no-verify", action="store_true", help="keep a mismatching file")
    export.add_argument("--engine", action="store_true", help="also build a TensorRT engine")
    export.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

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


_COMMANDS = {
    "backends": _cmd_backends,
    "plan": _cmd_plan,
    "export": _cmd_export,
    "bench": _cmd_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring).

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage error
        return int(exc.code or 0)
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _COMMANDS[args.command](args)
    except CliError as exc:
        if args.debug:
            raise
        print(f"embedl-dynamo {args.command}: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"embedl-dynamo {args.command}: internal error: {type(exc).__name__}: {first}. "
            "Rerun with --debug for the traceback and report it.",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
