"""Write the op conformance table into ``docs/op-conformance.md`` from its one source,
:mod:`embedl_dynamo.runtimes.conformance` (between the page's ``table`` markers).

    python -m bench.op_conformance_doc          # rewrite the page
    python -m bench.op_conformance_doc --check  # exit 1 if the page is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from embedl_dynamo.runtimes.conformance import markdown_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "op-conformance.md"
START, END = "<!-- table:start (python -m bench.op_conformance_doc) -->", "<!-- table:end -->"


def render(page: str) -> str:
    """``page`` with the table between its markers replaced by the current one."""
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{markdown_table()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is stale")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    new = render(page)
    if args.check:
        return 0 if new == page else 1
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
