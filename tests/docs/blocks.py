"""The ```python blocks of the documentation (README.md and docs/**/*.md), found for testing.

A block is marked by an HTML comment on the last non-blank line before its opening fence:

* ``<!-- skip: reason -->``: not run; the test is skipped with that reason (a GPU, a server, a
  long benchmark, a fragment of a file the reader writes);
* ``<!-- continue -->``: runs after the block before it in the same file, in its namespace,
  as one test (a chain is skipped when its first block is).

Indented fences (a block inside a list item) are read with their indentation removed.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "Chain", "chains", "documentation_files", "python_blocks"]

REPO = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(\s*)```+\s*(\w*)")
_MARKER = re.compile(r"^\s*<!--\s*(skip|continue)\s*:?\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced python block: where it starts, its code and its marker."""

    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    marker: str | None = None  # "skip", "continue" or None
    reason: str = ""


@dataclass
class Chain:
    """Blocks run one after another in one namespace (a block and its continuations)."""

    blocks: list[Block] = field(default_factory=list)

    @property
    def ident(self) -> str:
        first = self.blocks[0]
        return f"{first.path.relative_to(REPO).as_posix()}:{first.line}"

    @property
    def skip_reason(self) -> str | None:
        first = self.blocks[0]
        return first.reason or "marked skip" if first.marker == "skip" else None


def documentation_files(repo: Path = REPO) -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def python_blocks(path: Path) -> list[Block]:
    """The ```python (or ```py) blocks of one Markdown file, with their markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, language = fence.groups()
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")),
            len(lines),
        )
        if language in ("python", "py"):
            code = textwrap.dedent("\n".join(line for line in lines[i + 1 : end]))
            marker, reason = _marker_before(lines, i)
            blocks.append(Block(path, i + 1, code, marker, reason))
        i = end + 1
    return blocks


def _marker_before(lines: list[str], fence: int) -> tuple[str | None, str]:
    for j in range(fence - 1, -1, -1):
        if lines[j].strip():
            found = _MARKER.match(lines[j])
            return (found.group(1), found.group(2)) if found else (None, "")
    return None, ""


def chains(paths: list[Path] | None = None) -> list[Chain]:
    """Every block, grouped: a ``continue`` block joins the chain of the block before it."""
    result: list[Chain] = []
    for path in documentation_files() if paths is None else paths:
        previous: Chain | None = None
        for block in python_blocks(path):
            if block.marker == "continue" and previous is not None:
                previous.blocks.append(block)
            else:
                previous = Chain([block])
                result.append(previous)
    return result
