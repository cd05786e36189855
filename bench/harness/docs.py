"""``python -m bench docs [--check]``: the docs' benchmark tables, drawn from the records.

A page under ``docs/benchmarks/`` (and the changelog's benchmark history) marks each
generated table::

    <!-- bench:table bench/results/cpu_table/2026-11-27.json [view] -->
    (written here: the date, machine, versions and command line, then the table)
    <!-- bench:end -->

and this module writes between the markers what the record's plug-in renders
(:func:`bench.harness.runner.render_table`), headed by the record's date, machine, the
versions of torch and the runtimes, and the ``python -m bench run`` command that measures it
again. ``--check`` changes nothing and fails when a page differs from its records, so a table
is never edited by hand.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.harness.environment import REPOSITORY, machine_line
from bench.harness.record import Record
from bench.harness.runner import render_table

__all__ = ["CHANGELOG", "PAGES", "heading", "render_page", "update_pages"]

PAGES = REPOSITORY / "docs" / "benchmarks"
CHANGELOG = REPOSITORY / "docs" / "changelog.md"
MARKER = re.compile(
    r"<!-- bench:table (?P<path>\S+)(?: (?P<view>\w+))? -->\n(?P<body>.*?)<!-- bench:end -->",
    re.DOTALL,
)
_SHOWN = ("torch", "onnxruntime", "openvino", "nncf")


def heading(record: Record, path: str) -> str:
    """The lines above a generated table: when, where, with what, how to measure again, and
    the record's notes."""
    env = record.environment
    versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if k in _SHOWN)
    command = env.get("regenerate") or env["command"]
    text = f"*Measured {str(env['date'])[:10]} on {machine_line(env)}"
    text += f" ({versions})" if versions else ""
    text += f". Command: `{command}`. Record: `{path}`.*"
    if env.get("regenerate"):
        text += f" *(It ran as `{env['command']}`, before `python -m bench` existed.)*"
    for note in record.notes:
        text += f"\n\n*Note: {note}*"
    return text


def render_page(text: str, root: Path = REPOSITORY) -> str:
    """``text`` with every marked table drawn again from its record."""

    def draw(match: re.Match) -> str:
        path, view = match["path"], match["view"] or "main"
        record = Record.load(root / path)
        body = f"{heading(record, path)}\n\n{render_table(record, view)}\n"
        marker = f"{path} {view}" if view != "main" else path
        return f"<!-- bench:table {marker} -->\n{body}<!-- bench:end -->"

    return MARKER.sub(draw, text)


def update_pages(check: bool = False, pages: Path = PAGES) -> list[Path]:
    """Draw every page's tables again; returns the pages that changed (with ``check``: would)."""
    changed = []
    for page in [*sorted(pages.glob("*.md")), CHANGELOG]:
        text = page.read_text()
        new = render_page(text)
        if new != text:
            changed.append(page)
            if not check:
                page.write_text(new)
    return changed
