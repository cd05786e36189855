"""``embedl-dynamo deploy``: build a model's compile cache once, to ship to replicas.

A deployment is built where the cache can be written (a CI job, a build step of a container
image) and started where it is only read (replicas: ``EMBEDL_DYNAMO_CACHE_DIR`` at the shipped
copy, ``EMBEDL_DYNAMO_CACHE_READ_ONLY=1``). The command compiles ``MODULE:FACTORY`` through the
target's dynamo backend and calls it as a replica will (each batch size, enough calls for INT8
to calibrate), so every subgraph's artifact, calibration and decisions are in the cache; with
``--check`` a fresh process then starts from the cache read-only, as a replica, and fails unless
every subgraph loaded and nothing was built.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

from embedl_dynamo.cli.inputs import (
    EXIT_OK,
    EXIT_VERIFY,
    backend_named,
    calibration_batches,
    model_and_inputs,
    require_cache_writable,
)
from embedl_dynamo.errors import CliError

__all__ = ["add_deploy_parser", "run_deploy"]


def add_deploy_parser(sub: Any, model_args: Any) -> None:
    """The ``deploy`` subcommand's parser (``model_args`` adds model, shapes, backend, cache)."""
    from embedl_dynamo.precision import precision_names

    deploy = sub.add_parser("deploy", help="build a model's compile cache to ship to replicas")
    model_args(deploy)
    deploy.add_argument("--precision", choices=precision_names(), default="fp32")
    deploy.add_argument("--runtime", default="auto", help="runtime (default auto)")
    deploy.add_argument("--calibration", help="INT8 calibration data, .npy or .pt")
    deploy.add_argument(
        "--batch-sizes",
        default="",
        help="every batch size replicas will see, e.g. 1,8 (default: the shapes' own)",
    )
    deploy.add_argument(
        "--check", action="store_true", help="then start a replica from it read-only"
    )
    deploy.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        sizes = [0]
    if any(n < 1 for n in sizes):
        raise CliError(f"invalid --batch-sizes {text!r}; write positive sizes, e.g. 1,8")
    return sizes


def _compile_and_call(args: argparse.Namespace) -> list[Any]:
    """Compile the model and call it as replicas will; the subgraph reports."""
    import torch

    from embedl_dynamo.precision import get_precision
    from embedl_dynamo.report.record import clear_reports, last_report

    model, inputs = model_and_inputs(args)  # --input-shape and --input-dtype, as export reads them
    options: dict[str, Any] = {"precision": args.precision, "runtime": args.runtime}
    if args.cache_dir:
        options["cache_dir"] = args.cache_dir
    if args.calibration:
        options["calibration_data"] = calibration_batches(args.calibration, inputs)
    calls = 1
    if get_precision(args.precision).calibrates and not args.calibration:
        from embedl_dynamo.settings import Settings

        calls = Settings().calibration_steps + 1  # INT8 calibrates on its first calls
        if not args.replica:
            print(f"note: no --calibration: INT8 calibrates on {calls - 1} random inputs")
    clear_reports()
    compiled = torch.compile(model, backend=f"embedl_{args.backend}", options=options)
    sizes = _batch_sizes(args.batch_sizes) or [inputs[0].shape[0]]
    reports = []
    with torch.inference_mode():
        for size in sizes:
            batch = tuple(t[:1].expand(size, *t.shape[1:]).contiguous() for t in inputs)
            for i in range(calls):  # floats varied for calibration; ids, masks kept
                compiled(*(t * (1 + i / calls) if t.is_floating_point() else t for t in batch))
            reports += [r for r in last_report() if r not in reports]
    return reports


def run_deploy(args: argparse.Namespace) -> int:
    """Build (or, as ``--replica``, start from) the cache and print what each subgraph did."""
    from embedl_dynamo.cache.files import wait_for_cache_writes

    backend_named(args.backend)
    if not args.replica:  # a replica reads the cache; the build must be able to write it
        require_cache_writable(args.cache_dir)
    reports = _compile_and_call(args)
    wait_for_cache_writes()
    built = [r for r in reports if r.status == "compiled" and not r.loaded]
    for r in reports:
        origin = r.loaded or ("built" if r.status == "compiled" else r.reason or r.status)
        print(f"  subgraph {r.index}: {r.runtime:<12} {origin}")
    if args.replica:
        if built:
            names = ", ".join(str(r.index) for r in built)
            raise CliError(
                f"replica built subgraph(s) {names}: the cache lacks them. The key holds the "
                "weights: does the factory build the same weights in every process (seeded "
                "or loaded)?",
                EXIT_VERIFY,
            )
        print(f"replica check: {len(reports)} subgraph(s) loaded, nothing built or written")
        return EXIT_OK
    where = args.cache_dir or "the default cache"
    print(f"cache ready in {where}: {len(built)} subgraph(s) built")
    if args.check:
        return _check_replica(args)
    return EXIT_OK


def _check_replica(args: argparse.Namespace) -> int:
    """Start the model in a fresh process from the cache, read-only, as a replica."""
    from embedl_dynamo.cache.files import ENV_CACHE_READ_ONLY

    argv = [a for a in args.argv if a != "--check"]
    env = {**os.environ, ENV_CACHE_READ_ONLY: "1"}
    command = [sys.executable, "-m", "embedl_dynamo.cli", *argv, "--replica"]
    done = subprocess.run(command, env=env, check=False)
    return done.returncode
