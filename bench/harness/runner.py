"""``python -m bench run <name>``: one suite or probe, one record, one file.

The runner parses the options every plug-in shares (``--smoke``, ``--out``, ``--threads``)
and the plug-in's own, sets PyTorch's threads, opens the record with its environment block,
runs the plug-in, sets the ratios to the baseline, writes the record (also when the run stops
part-way: what was measured is kept, with a note saying where it stopped) and prints its table.
A full run writes ``bench/results/<name>/<UTC date and time>.json`` unless ``--out`` says
otherwise; a smoke run writes only where ``--out`` says.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import shlex
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.harness import plugins
from bench.harness.environment import REPOSITORY, environment
from bench.harness.record import Record
from bench.harness.table import by_variant

__all__ = ["RESULTS", "default_out", "parser_for", "render_table", "run"]

logger = logging.getLogger(__name__)

RESULTS = REPOSITORY / "bench" / "results"


def parser_for(name: str, module: ModuleType) -> argparse.ArgumentParser:
    """The runner's options and the plug-in's own."""
    parser = argparse.ArgumentParser(
        prog=f"python -m bench run {name}", description=plugins.summary(name)
    )
    parser.add_argument("--smoke", action="store_true", help="a run of seconds: tiny model")
    parser.add_argument("--out", type=Path, help="write the record here")
    parser.add_argument("--threads", type=int, default=2, help="PyTorch's threads (default 2)")
    module.arguments(parser)
    return parser


def default_out(name: str) -> Path:
    """Where a full run's record goes: ``bench/results/<name>/<UTC time>.json``."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
    return RESULTS / name / f"{stamp}.json"


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    settings = {}
    for key, value in vars(args).items():
        if isinstance(value, Path):
            value = str(value)
        if value is None or isinstance(value, str | int | float | bool | list | tuple):
            settings[key] = list(value) if isinstance(value, tuple) else value
    return settings


def render_table(record: Record, view: str = "main") -> str:
    """The plug-in's table of ``record`` (by variant of its first time metric by default)."""
    module = plugins.plugin(record.suite)
    if hasattr(module, "table"):
        return module.table(record, view)
    metric = next((r["metric"] for r in record.rows if r["ratio"] is not None), None)
    if metric is None:
        metric = next((r["metric"] for r in record.rows if r["metric"] != "error"), "error")
    return by_variant(record, metric, show="ratio" if record.baseline else "value")


def run(name: str, argv: Sequence[str]) -> Record:
    """Run suite or probe ``name`` with command-line options ``argv``; returns its record."""
    module = plugins.plugin(name)
    args = parser_for(name, module).parse_args(list(argv))
    if args.smoke and hasattr(module, "smoke"):
        module.smoke(args)
    import torch

    torch.set_num_threads(args.threads)
    command = shlex.join(["python", "-m", "bench", "run", name, *argv])
    record = Record(name, environment(command), _settings(args), module.BASELINE)
    out = args.out or (None if args.smoke else default_out(name))
    try:
        module.run(args, record)
    except BaseException as error:
        record.notes.append(f"the run stopped here: {type(error).__name__}: {error}"[:300])
        raise
    finally:
        record.finish()
        if out is not None and record.rows:
            print(f"record: {record.write(out)}", flush=True)
    print(render_table(record))
    return record
