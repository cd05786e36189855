"""``python -m bench``: run a suite or probe, compare two records, draw one, list them.

python -m bench list                                   # the suites and probes
python -m bench run cpu_table [--smoke] [--out F.json] [suite options]
python -m bench run cpu_table --help                   # a suite's own options
python -m bench compare A.json B.json [--noise 0.03]   # pyperf's compare_to
python -m bench plot RECORD.json -o out.png [--metric latency]
python -m bench table RECORD.json [--view main]        # the Markdown table
python -m bench docs [--check]                         # docs/benchmarks/ tables from records
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the suites and probes")
    run = commands.add_parser("run", help="run a suite or probe", add_help=False)
    run.add_argument("name")
    compare = commands.add_parser("compare", help="two records side by side")
    compare.add_argument("a")
    compare.add_argument("b")
    compare.add_argument("--noise", type=float, default=0.03)
    plot = commands.add_parser("plot", help="draw a record")
    plot.add_argument("record")
    plot.add_argument("-o", "--output", required=True)
    plot.add_argument("--metric", help="the metric to draw (default: the plug-in's chart)")
    table = commands.add_parser("table", help="a record's Markdown table")
    table.add_argument("record")
    table.add_argument("--view", default="main")
    docs = commands.add_parser("docs", help="draw docs/benchmarks/'s tables from their records")
    docs.add_argument("--check", action="store_true", help="fail if a page is out of date")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = _parser().parse_known_args(argv)
    from bench.harness import plugins
    from bench.harness.record import Record

    if args.command == "run":
        from bench.harness.runner import run

        try:
            run(args.name, rest)
        except ValueError as error:
            if args.name in plugins.names():
                raise
            raise SystemExit(f"python -m bench run: {error}") from None
        return 0
    if rest:
        _parser().error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "list":
        for name in plugins.names():
            print(f"{plugins.kind(name):<6} {name:<20} {plugins.summary(name)}")
    elif args.command == "compare":
        from bench.harness.compare import compare

        print(compare(Record.load(args.a), Record.load(args.b), args.noise))
    elif args.command == "plot":
        from bench.harness.plot import plot

        plot(Record.load(args.record), args.output, args.metric)
        print(f"wrote {args.output}")
    elif args.command == "table":
        from bench.harness.runner import render_table

        print(render_table(Record.load(args.record), args.view))
    elif args.command == "docs":
        from bench.harness.docs import update_pages

        changed = update_pages(check=args.check)
        for page in changed:
            print(f"{'out of date' if args.check else 'rewrote'}: {page}")
        return 1 if args.check and changed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
