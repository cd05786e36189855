"""Every ```python block of README.md and docs/ runs, so the documentation's code cannot rot.

Each chain of blocks (:mod:`tests.docs.blocks`: a block and its ``<!-- continue -->`` blocks)
runs with ``exec`` in a fresh namespace, in a temporary working directory with a private cache,
and fails with the block's file and line. ``<!-- skip: reason -->`` skips it with the reason.
"""

from __future__ import annotations

import pytest
import torch

from tests.docs.blocks import Block, chains, python_blocks

pytestmark = pytest.mark.usefixtures("compile_isolation")

CHAINS = chains()


def _run(block: Block, namespace: dict) -> None:
    code = compile(block.code, f"{block.path}:{block.line}", "exec")
    exec(code, namespace)  # noqa: S102 - running the documentation's code is the test


@pytest.mark.parametrize("chain", CHAINS, ids=[c.ident for c in CHAINS])
def test_code_block_runs(chain, tmp_path, monkeypatch):
    if chain.skip_reason is not None:
        pytest.skip(chain.skip_reason)
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict = {"__name__": "__docs__"}
    for block in chain.blocks:
        _run(block, namespace)


def test_markers_are_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\na = 1\n```\n\n<!-- continue -->\n```python\nb = a + 1\n```\n"
        "<!-- skip: needs a GPU -->\n\n```python\nraise SystemExit\n```\n"
        "- item\n\n  ```python\n  c = 3\n  ```\n"
    )
    blocks = python_blocks(page)
    assert [(b.line, b.marker, b.reason) for b in blocks] == [
        (1, None, ""),
        (6, "continue", ""),
        (11, "skip", "needs a GPU"),
        (16, None, ""),
    ]
    assert blocks[3].code == "c = 3"
    grouped = chains([page])
    assert [len(c.blocks) for c in grouped] == [2, 1, 1]
    assert [c.skip_reason for c in grouped] == [None, "needs a GPU", None]
