"""Code branches on typed outcomes, never on the wording of a report (issue 52, "prose used as
an API"): outside ``report/``, no ``in``, ``==``, ``!=``, ``startswith`` or ``endswith`` applies
a string to a reason or a note (``report.reason``, ``choice.note``, ``why``). Report text is
rendered from the typed fields (``SubgraphReport.calibrating``, ``lower_rejected``,
``RuntimeChoice.from_cache``), which the code reads instead."""

from __future__ import annotations

import ast
from pathlib import Path

import embedl_dynamo

PACKAGE = Path(embedl_dynamo.__file__).resolve().parent
WORDING = frozenset({"reason", "reasons_text", "note", "why", "message"})


def _is_wording(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in WORDING
    if isinstance(node, ast.Name):
        return node.id in WORDING
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value in WORDING
    return False


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, (ast.Constant, ast.JoinedStr)) and not isinstance(
        getattr(node, "value", ""), (int, float, type(None))
    )


def branches_on_wording(tree: ast.AST) -> list[int]:
    """The lines of ``tree`` that test a reason's or a note's text."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides, sides[1:]):
                contains = isinstance(op, (ast.In, ast.NotIn)) and _is_text(left)
                equals = isinstance(op, (ast.Eq, ast.NotEq)) and (
                    _is_wording(left) and _is_text(right) or _is_wording(right) and _is_text(left)
                )
                if contains and _is_wording(right) or equals:
                    lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            prefix = node.func.attr in ("startswith", "endswith")
            if prefix and _is_wording(node.func.value):
                lines.append(node.lineno)
    return lines


def test_no_branch_on_report_wording():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "report":
            continue
        for line in branches_on_wording(ast.parse(path.read_text())):
            found.append(f"{path.relative_to(PACKAGE)}:{line}")
    assert not found, f"branch on a reason's or note's wording (use a typed field): {found}"


def test_the_check_finds_each_form():
    source = """
if "calibrates" in report.reason: pass
if choice.note == "cached": pass
if why.startswith("no row"): pass
if report.reason: pass
if "x" in reasons: pass
"""
    assert branches_on_wording(ast.parse(source)) == [2, 3, 4]
