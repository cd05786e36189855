"""The subcommands: ``backends``, ``plan``, ``export``, ``bench``, ``serve``, ``cache``,
``deploy``; each returns an exit code."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from embedl_dynamo.cli.deploy_command import run_deploy
from embedl_dynamo.cli.inputs import (
    EXIT_EXPORT,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_VERIFY,
    backend_named,
    load_calibration,
    model_and_inputs,
    require_writable,
)
from embedl_dynamo.cli.signals import sigterm_interrupts
from embedl_dynamo.errors import (
    CalibrationDataError,
    CliError,
    EngineUnavailableError,
    ExportArgumentError,
    ExportError,
    VerificationError,
    error_line,
)

__all__ = ["COMMANDS", "format_rows"]


def run_backends(args: argparse.Namespace) -> int:
    from embedl_dynamo.backend import discover_backends
    from embedl_dynamo.runtimes import runtime_classes

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
    print(format_rows(rows))
    for name in sorted(backends):
        if backends[name].description:
            print(f"  {name}: {backends[name].description}")
    print()
    rows = [("runtime", "available", "why not")]
    for name, cls in runtime_classes().items():
        missing = cls.missing()
        rows.append((name, "yes" if missing is None else "no", missing or ""))
    print(format_rows(rows))
    return EXIT_OK


def run_plan(args: argparse.Namespace) -> int:
    from embedl_dynamo.graph.capture import capture
    from embedl_dynamo.pipeline import run_pipeline

    backend = backend_named(args.backend)
    require_writable(args.html, "--html")
    model, inputs = model_and_inputs(args)
    try:
        result = run_pipeline(capture(model, inputs), inputs, backend)
    except ValueError as exc:  # the model rejects the inputs: a shape problem, not a capture one
        raise CliError(f"{exc}", EXIT_USAGE) from exc
    except RuntimeError as exc:
        raise CliError(f"{exc}", EXIT_EXPORT) from exc
    print(result.plan)
    summary = result.plan.summary()
    print(
        f"\n{summary['applied_count']} applied, {summary['skipped_count']} skipped "
        f"(backend {backend.name}); disable entries by glob with plan.disable('<id glob>')"
    )
    if args.html:
        from embedl_dynamo.report.compile_report import CompileReport
        from embedl_dynamo.report.subgraph import SubgraphReport

        ops = sum(n.op.startswith("call") for n in result.plan.model.graph.nodes)
        sub = SubgraphReport(
            index=0,
            backend=backend.name,
            runtime="none (planned only)",
            ops=ops,
            status="planned",
            pipeline=result.report,
        )
        sub.plan = result.plan
        try:
            path = CompileReport([sub]).to_html(args.html)
        except OSError as exc:
            raise CliError(f"cannot write {args.html}: {exc.strerror or exc}", EXIT_EXPORT) from exc
        print(f"wrote {path}")
    return EXIT_OK


def run_export(args: argparse.Namespace) -> int:
    import json

    from embedl_dynamo.deploy.export import export, sidecar_path
    from embedl_dynamo.precision import get_precision, precision_names

    backend_named(args.backend)
    precision = "int8" if args.int8 else args.precision
    if args.int8 and args.precision not in (None, "int8"):
        raise CliError(f"--int8 conflicts with --precision {args.precision}; give one")
    calibrated = [n for n in precision_names() if get_precision(n).calibrates]
    if args.calibration and precision not in calibrated:
        raise CliError(
            f"--calibration is only used with --precision {'/'.join(calibrated)}; add one or drop it"
        )
    require_writable(args.output, "-o", longest=".data")
    model, inputs = model_and_inputs(args)
    calibration = (
        load_calibration(args.calibration, inputs[0].shape[0]) if args.calibration else None
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
            precision=precision,
            calibration_data=calibration,
            dynamic_batch=not args.static_batch,
            opset=args.opset,
            verify=not args.no_verify,
            engine=args.engine,
            html=args.html,
            options=options,
            progress=not args.quiet,
        )
    except VerificationError as exc:
        raise CliError(str(exc), EXIT_VERIFY) from exc
    except EngineUnavailableError as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from exc
    except (ExportArgumentError, CalibrationDataError) as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except ExportError as exc:
        raise CliError(str(exc), EXIT_EXPORT) from exc
    side = json.loads(sidecar_path(path).read_text())
    check = side["verification"]
    print(f"wrote {path} and {sidecar_path(path).name}")
    print(
        f"  {side['plan']['applied_count']} plan entries applied, "
        f"{'INT8 QDQ' if side['quantized'] else 'float'}, "
        f"max abs diff {check['max_abs_diff']:.3g} vs {check['compared_with']}"
        + (f" (tolerance {check['tolerance']:.3g})" if check["tolerance"] is not None else "")
    )
    if side["quantized"]:
        print(
            f"  {len(side['quantization']['float_layers'])} layers left in float "
            f"(see {sidecar_path(path).name}); cosine to float {check['cosine_to_float']:.5f}"
        )
    if args.triton_repository:
        _write_triton(path, args)
    return EXIT_OK


def _write_triton(path: Any, args: argparse.Namespace) -> None:
    from embedl_dynamo.deploy.triton import write_triton_repository
    from embedl_dynamo.deploy.triton_versions import latest_version
    from embedl_dynamo.errors import RuntimeUnavailableError

    try:
        model_dir = write_triton_repository(
            path,
            args.triton_repository,
            name=args.triton_name,
            instances=args.triton_instances,
            threads=args.triton_threads,
            max_batch_size=args.triton_max_batch,
        )
    except ExportArgumentError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except RuntimeUnavailableError as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from exc
    print(f"wrote Triton model {model_dir} (config.pbtxt, {latest_version(model_dir)}/)")


def run_bench(args: argparse.Namespace) -> int:
    import torch

    from embedl_dynamo.deploy.benchmark import format_table, measure, plot_latencies

    backend_named(args.backend)
    if not args.no_int8:
        backend_named(args.int8_backend)
    require_writable(args.plot, "--plot")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, inputs = model_and_inputs(args)
    cache = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    with torch.no_grad():
        reference = model(*inputs)
    reference = [reference] if isinstance(reference, torch.Tensor) else list(reference)
    kw = {"warmup": args.warmup, "repeats": args.repeats, "reference": reference}
    from embedl_dynamo.report.record import clear_reports, last_report

    rows = [measure("eager", model, inputs, **kw)]
    notes = []
    torch._dynamo.reset()
    clear_reports()
    compiled = torch.compile(model, backend=f"embedl_{args.backend}", options=dict(cache))
    rows.append(measure(f"embedl_{args.backend} float", compiled, inputs, **kw))
    notes.append(f"{rows[-1].name}: " + "; ".join(str(s) for s in last_report()))
    if not args.no_int8:
        torch._dynamo.reset()
        calibration = (
            load_calibration(args.calibration, inputs[0].shape[0])
            if args.calibration
            else [
                tuple(torch.randn_like(t) if t.is_floating_point() else t for t in inputs)
                for _ in range(8)
            ]
        )
        options = {**cache, "quantize": "int8", "calibration_data": calibration}
        clear_reports()
        int8 = torch.compile(model, backend=f"embedl_{args.int8_backend}", options=options)
        rows.append(measure(f"embedl_{args.int8_backend} int8", int8, inputs, **kw))
        notes.append(f"{rows[-1].name}: " + "; ".join(str(s) for s in last_report()))
    shapes = " ".join("x".join(map(str, s)) for s in args.input_shape)
    print(
        f"{args.model}  input {shapes}  threads {torch.get_num_threads()}  "
        f"medians over {args.repeats} runs"
    )
    print(format_table(rows, baseline="eager"))
    for note in notes:  # where each compiled variant really ran (eager fallbacks show here)
        print(f"  {note}")
    if args.plot:
        plot_latencies(rows, args.plot, title=f"{args.model} ({shapes})")
        print(f"wrote {args.plot}")
    return EXIT_OK


def run_serve(args: argparse.Namespace) -> int:
    import importlib.util
    import logging
    import time
    from pathlib import Path

    from embedl_dynamo.serve import check_artifact, choose_serving, deploy, undeploy

    if not Path(args.path).is_file():
        raise CliError(
            f"no file at {args.path!r}; export one with embedl-dynamo export", EXIT_USAGE
        )
    scaled = (args.min_replicas, args.max_replicas)
    if (None in scaled) != (scaled == (None, None)):
        raise CliError("give both --min-replicas and --max-replicas, or neither", EXIT_USAGE)
    try:  # load()'s own check, before Ray: a changed or garbage file is refused at once
        check_artifact(args.path)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    if importlib.util.find_spec("ray") is None:
        needs = "serving needs Ray Serve; pip install 'ray[serve]>=2.40'"
        raise CliError(needs, EXIT_UNAVAILABLE)
    if not args.debug:  # Serve's driver-side INFO lines ("Started Serve", ...) stay quiet
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    autoscaling = (
        {"min_replicas": args.min_replicas, "max_replicas": args.max_replicas}
        if args.min_replicas is not None
        else None
    )
    name = args.name or Path(args.path).stem
    try:
        if args.objective:  # measured once here (and cached), then used by deploy
            choice = choose_serving(
                args.path,
                objective=args.objective,
                latency_budget_ms=args.latency_budget_ms,
                cpus=max(1, int(args.cpus_per_replica)),
            )
            print(f"{choice.note}: batch {choice.batch}, {choice.threads} thread(s) per replica")
        deploy(
            args.path,
            name=args.name,
            host=args.host,
            port=args.port,
            address=args.address,
            grpc_port=args.grpc_port,
            replicas=args.replicas,
            cpus_per_replica=args.cpus_per_replica,
            threads=args.threads,
            max_batch_size=args.max_batch,
            autoscaling=autoscaling,
            objective=args.objective,
            latency_budget_ms=args.latency_budget_ms,
        )
    except (ValueError, FileNotFoundError) as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except ImportError as exc:
        raise CliError(
            f"{exc}; pip install 'ray[serve]>=2.40' 'tritonclient[grpc,http]>=2.40'",
            EXIT_UNAVAILABLE,
        ) from exc
    except RuntimeError as exc:  # Serve's deployment failed: a replica that cannot answer
        why = error_line(exc, with_type=False)
        raise CliError(f"the replicas did not start: {why}", EXIT_INTERNAL) from exc
    grpc = f" and gRPC at {args.host}:{args.grpc_port}" if args.grpc_port else ""
    print(
        f"serving {args.path} at http://{args.host}:{args.port}/v2/models/{name}/infer{grpc} "
        "(KServe v2); Ctrl-C or SIGTERM stops it",
        flush=True,
    )
    try:
        # installed after Ray's own handler (ray.init sets one that exits without undeploying)
        with sigterm_interrupts():  # a process manager's stop, as Ctrl-C
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        undeploy(name)  # only what serve started: in a cluster it joined, the application
        print("stopped")
    return EXIT_OK


def run_cache(args: argparse.Namespace) -> int:
    from pathlib import Path

    from embedl_dynamo.cache.budget import (
        cache_entries,
        clear_cache,
        max_cache_bytes,
    )
    from embedl_dynamo.cache.files import default_cache_dir
    from embedl_dynamo.errors import NotACacheError

    root = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    if args.action == "clear":
        try:
            freed = clear_cache(root)
        except NotACacheError as exc:
            raise CliError(str(exc), EXIT_USAGE) from exc
        print(f"cleared {root}: {_megabytes(freed)} freed")
        return EXIT_OK
    entries = cache_entries(root)
    rows = [("namespace", "entries", "size")]
    for name in sorted({e.namespace for e in entries}):
        mine = [e for e in entries if e.namespace == name]
        rows.append((name, str(len(mine)), _megabytes(sum(e.size for e in mine))))
    rows.append(("total", str(len(entries)), _megabytes(sum(e.size for e in entries))))
    budget = max_cache_bytes()
    print(f"cache {root} (budget {'unlimited' if budget is None else _megabytes(budget)})")
    print(format_rows(rows))
    return EXIT_OK


def _megabytes(n: int) -> str:
    return f"{n / 1024**2:.1f} MB"


def format_rows(rows: Sequence[Sequence[str]]) -> str:
    """Rows of strings as a left-aligned table with a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


COMMANDS = {
    "backends": run_backends,
    "plan": run_plan,
    "export": run_export,
    "bench": run_bench,
    "serve": run_serve,
    "cache": run_cache,
    "deploy": run_deploy,
}
