"""Write the op conformance table into ``docs/op-conformance.md`` from its one source,
:mod:`embedl_dynamo.runtimes.conformance` (between the page's ``table`` markers).

    python -m tools.op_conformance_doc          # rewrite the page
    python -m tools.op_conformance_doc --check  # exit 1 if the page is out of date
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from embedl_dynamo.runtimes.conformance import CPU_RUNTIMES, ROWS, STRUCTURAL, OpRow, Rule

__all__ = ["PAGE", "main", "markdown_table", "render"]

PAGE = Path(__file__).resolve().parents[1] / "docs" / "op-conformance.md"
START, END = "<!-- table:start (python -m tools.op_conformance_doc) -->", "<!-- table:end -->"


def _cell(rules: tuple[Rule, ...]) -> str:
    parts = []
    for rule in rules:
        label = (
            rule.verdict.value if rule.dtypes == "any" else f"{rule.dtypes}: {rule.verdict.value}"
        )
        parts.append(label)
    return "; ".join(parts)


def _checked(row: OpRow) -> str:
    """What checks the row: its OpInfo entries, a test file, or ``structural``."""
    if row.opinfo:
        return "OpInfo " + ", ".join(row.opinfo)
    return row.checked_by if row.checked_by == STRUCTURAL else f"`tests/{row.checked_by}`"


def markdown_table(rows: Iterable[OpRow] = ROWS) -> str:
    """The table as Markdown: one line per op, a column per runtime, then the reasons."""
    rows = tuple(rows)
    lines = [
        "| op | checked by | " + " | ".join(CPU_RUNTIMES) + " |",
        "|---|---|" + "---|" * len(CPU_RUNTIMES),
    ]
    notes: dict[str, list[str]] = {}
    for row in rows:
        cells = [_cell(row.rules.get(r, ())) for r in CPU_RUNTIMES]
        lines.append(f"| `{row.op}` | {_checked(row)} | " + " | ".join(cells) + " |")
        for runtime in CPU_RUNTIMES:
            for rule in row.rules.get(runtime, ()):
                if rule.reason:
                    notes.setdefault(rule.reason, []).append(
                        f"`{row.op}` ({runtime}, {rule.dtypes})"
                    )
    known = [(row.op, d) for row in rows for d in row.differs]
    lines += [
        "",
        "Known differences on edge values (listed, not fixed; the suite expects them):",
        "",
    ]
    lines += [f"- `{op}` on {d.runtime}, {d.edge}: {d.reason}" for op, d in known]
    lines.append("")
    lines.append("Reasons:")
    lines.append("")
    lines += [f"- {reason}: {', '.join(where)}" for reason, where in notes.items()]
    return "\n".join(lines) + "\n"


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
