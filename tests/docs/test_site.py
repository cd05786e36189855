"""The documentation's structure: the README stays a front door, the API page lists every
public name, CI's script runs the README's set-up, and the README's links resolve."""

from __future__ import annotations

import importlib
import re
import shlex
import unicodedata

import embedl_dynamo
from tests.docs.blocks import REPO

README = REPO / "README.md"


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"


def _documented() -> dict[str, object]:
    """The objects docs/api.md renders, by the name their entry ends with: a dotted path that
    names a module is that module (as mkdocstrings reads it), even where the package has an
    attribute of the same name."""
    page = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    out = {}
    for path in re.findall(r"^::: (embedl_dynamo(?:\.\w+)+)\s*$", page, re.MULTILINE):
        module, _, name = path.rpartition(".")
        try:
            out[name] = importlib.import_module(path)
        except ModuleNotFoundError:
            out[name] = getattr(importlib.import_module(module), name)
    return out


def test_every_public_name_is_in_the_api_reference():
    documented = _documented()
    missing = sorted(set(embedl_dynamo.__all__) - set(documented))
    assert not missing, f"add '::: embedl_dynamo.<name>' entries to docs/api.md for {missing}"
    unknown = sorted(set(documented) - set(embedl_dynamo.__all__))
    assert not unknown, f"docs/api.md documents names not in embedl_dynamo.__all__: {unknown}"
    # `::: embedl_dynamo.transform` would render the module transform.py, not the function
    other = [n for n, obj in documented.items() if obj is not getattr(embedl_dynamo, n)]
    assert not other, f"docs/api.md's entries for {other} render another object than the name"


def _commands(text: str) -> list[list[str]]:
    """Shell commands, split on && and newlines, comments dropped, pip's -q ignored."""
    out = []
    for line in text.splitlines():
        for part in line.split("#", 1)[0].split("&&"):
            words = [w for w in shlex.split(part) if w != "-q"]
            if words:
                out.append(words)
    return out


def test_ci_runs_the_readme_set_up_and_test_commands():
    block = re.search(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert block, "README.md starts with a bash block of set-up and test commands"
    readme = [c for c in _commands(block.group(1)) if c[:2] != ["python", "examples/quickstart.py"]]
    ci = _commands((REPO / ".ci" / "run").read_text(encoding="utf-8"))
    # CI may add options at the end (pytest's -p no:cacheprovider), nothing else
    missing = [" ".join(c) for c in readme if not any(c == d[: len(c)] for d in ci)]
    assert not missing, f".ci/run does not run the README's {missing}"


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading (its default slugify)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_readme_links_resolve():
    """mkdocs checks the site's links; the README is outside it, so its links are checked here."""
    text = README.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = REPO / path
        if not file.exists():
            broken.append(target)
        elif anchor:
            headings = re.findall(r"^#+\s+(.+?)\s*$", file.read_text(encoding="utf-8"), re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    assert not broken, f"README.md links to missing files or anchors: {broken}"
