"""The API page as readers see it: the site built (``mkdocs build --strict``, as CI builds it)
shows every public name once and no raw Sphinx role, which mkdocstrings' google style prints as
text (docstrings cross-reference with ``[name][embedl_dynamo.name]``, or use a code span); and
every public name's docstring has an example, whose ``>>>`` lines run as doctests.

The build runs where the docs extra is installed (``pip install -e '.[docs]'``), else it skips.
"""

from __future__ import annotations

import doctest
import html
import importlib
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

import embedl_dynamo
from tests.docs.blocks import REPO

# a reST role as Sphinx writes it (:func:`x`, :class:`~.y`, :py:meth:`z`); in the page's text
# the backticks are gone (Markdown made the target a code span): ":func:x"
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|ref):[`~.\w]")


@pytest.fixture(scope="module")
def api_page(tmp_path_factory) -> str:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)]
    done = subprocess.run(build, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    return (site / "api" / "index.html").read_text(encoding="utf-8")


def test_api_page_shows_no_raw_roles(api_page):
    text = html.unescape(re.sub(r"<[^>]+>", "", api_page))
    raw = [text[max(m.start() - 60, 0) : m.end() + 40] for m in ROLE.finditer(text)]
    assert not raw, "write [name][embedl_dynamo.name] or `name` instead of reST roles:\n" + (
        "\n".join(raw)
    )


def test_api_page_shows_each_public_name_once(api_page):
    # every heading mkdocstrings writes (an entry's and its members'), by the name it ends with:
    # `::: embedl_dynamo.transform` would show the module's functions as members, a second time
    anchors = re.findall(r'<h\d id="(embedl_dynamo\.[\w.]+)" class="doc doc-heading"', api_page)
    public = set(embedl_dynamo.__all__)
    entries = Counter(a.rpartition(".")[2] for a in anchors if a.rpartition(".")[2] in public)
    twice = sorted(name for name, count in entries.items() if count > 1)
    assert not twice, f"the API page shows {twice} more than once"
    missing = sorted(set(embedl_dynamo.__all__) - set(entries))
    assert not missing, f"the API page does not show {missing}"


@pytest.mark.parametrize("name", embedl_dynamo.__all__)
def test_public_name_has_an_example(name):
    doc = getattr(embedl_dynamo, name).__doc__ or ""
    section = re.search(r"^\s*Examples?:\s*$", doc, re.MULTILINE)
    assert section, f"embedl_dynamo.{name}'s docstring has no 'Example:' section"
    body = doc[section.end() :]
    assert ">>> " in body or "```" in body, (
        f"embedl_dynamo.{name}'s Example: section has no '>>>' snippet or fenced code block"
    )


DOCTESTS = [n for n in embedl_dynamo.__all__ if ">>> " in (getattr(embedl_dynamo, n).__doc__ or "")]


@pytest.mark.usefixtures("compile_isolation")
@pytest.mark.parametrize("name", DOCTESTS)
def test_doctest_examples_run(name):
    """The ``>>>`` examples are the cheap ones (fenced blocks show what needs a model and data)."""
    obj = getattr(embedl_dynamo, name)
    globs = {**vars(importlib.import_module(obj.__module__))}
    test = doctest.DocTestParser().get_doctest(obj.__doc__, globs, name, obj.__module__, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0, f"embedl_dynamo.{name}'s example failed (see the output above)"
