"""Markdown tables drawn from a result record's rows, the way every docs table is made.

Two shapes cover the suites: :func:`by_variant` (a line per model and params, a column per
variant: one metric, as its ratio to the baseline or as its value) and :func:`by_metric` (a
line per model, params and variant, a column per metric). A variant that failed shows its
one-line reason in its cell. A suite with a table of its own (the CPU table's summary) builds
it from the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.harness.record import Record

__all__ = ["by_metric", "by_variant", "cell", "groups", "number", "param_text"]


def number(value: Any) -> str:
    """A value as a table cell: four significant digits (five decimals from 0.9 to 1, where
    cosines sit), one decimal from 1000 up."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:.1f}"
        if 0.9 <= abs(value) < 1.0:  # cosines: the digits that tell them apart
            return f"{value:.5f}".rstrip("0")
        return f"{value:.4g}"
    return str(value)


def _row(cells: Sequence[str]) -> str:
    """One Markdown table line (a ``|`` inside a cell escaped)."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def param_text(params: Mapping[str, Any]) -> str:
    """``{"batch": 8}`` as ``batch 8``."""
    return ", ".join(f"{k} {v}" for k, v in params.items())


def groups(record: Record, rows: Iterable[dict] | None = None) -> list[tuple[str, dict]]:
    """The distinct (model, params) of ``rows`` (all rows), in the order they were measured."""
    seen: dict[tuple[str, str], tuple[str, dict]] = {}
    for row in record.rows if rows is None else rows:
        key = (row["model"], json.dumps(row["params"], sort_keys=True))
        seen.setdefault(key, (row["model"], row["params"]))
    return list(seen.values())


def _error(record: Record, model: str, variant: str, params: dict) -> str | None:
    found = record.find(model=model, variant=variant, metric="error", params=params)
    return found[0]["error"] if found else None


def cell(record: Record, model: str, variant: str, metric: str, params: dict, show: str) -> str:
    """One variant's cell: its ratio or value, else ``fails: <reason>``, else ``-``."""
    found = record.find(model=model, variant=variant, metric=metric, params=params)
    if found and found[0][show] is not None:
        return number(found[0][show])
    error = _error(record, model, variant, params)
    return f"fails: {error[:60]}" if error else "-"


def _variants(record: Record, metric: str) -> list[str]:
    """The variants with ``metric`` (or an error), in the order they were first measured."""
    having = {r["variant"] for r in record.rows if r["metric"] in (metric, "error")}
    return [v for v in dict.fromkeys(r["variant"] for r in record.rows) if v in having]


def by_variant(
    record: Record,
    metric: str,
    *,
    show: str = "ratio",
    variants: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> str:
    """A line per model and params, a column per variant, each cell ``metric``'s ``show``
    (``ratio`` to the baseline, whose own value is then a column, or ``value``)."""
    labels = labels or {}
    names = list(variants or _variants(record, metric))
    base = record.baseline if show == "ratio" else None
    if base in names:
        names.remove(base)
    lines_of = groups(record, [r for r in record.rows if r["metric"] in (metric, "error")])
    keys = list(dict.fromkeys(k for _, params in lines_of for k in params))
    unit = next((r["unit"] for r in record.rows if r["metric"] == metric), "")
    head = ["model", *keys] + ([f"{base} {unit}"] if base else [])
    head += [labels.get(n, n) for n in names]
    lines = [_row(head), "|" + "---|" * len(head)]
    for model, params in lines_of:
        cells = [model, *(str(params.get(k, "")) for k in keys)]
        if base:
            cells.append(cell(record, model, base, metric, params, "value"))
        cells += [cell(record, model, n, metric, params, show) for n in names]
        lines.append(_row(cells))
    return "\n".join(lines)


def by_metric(
    record: Record,
    metrics: Sequence[str],
    *,
    labels: Mapping[str, str] | None = None,
    variants: Sequence[str] | None = None,
) -> str:
    """A line per model, params and variant, a column per metric (its value and unit)."""
    labels = labels or {}
    wanted = set(variants) if variants is not None else None
    seen: dict[tuple, tuple[str, dict, str]] = {}
    for row in record.rows:
        if row["metric"] in (*metrics, "error") and (wanted is None or row["variant"] in wanted):
            key = (row["model"], json.dumps(row["params"], sort_keys=True), row["variant"])
            seen.setdefault(key, (row["model"], row["params"], row["variant"]))
    keys = list(dict.fromkeys(k for _, params, _ in seen.values() for k in params))
    units = {r["metric"]: r["unit"] for r in record.rows}
    head = ["model", *keys, "variant"]
    head += [labels.get(m, f"{m} ({units[m]})" if units.get(m) else m) for m in metrics]
    lines = [_row(head), "|" + "---|" * len(head)]
    for model, params, variant in seen.values():
        cells = [model, *(str(params.get(k, "")) for k in keys), variant]
        error = _error(record, model, variant, params)
        values = [cell(record, model, variant, m, params, "value") for m in metrics]
        if error and all(v == f"fails: {error[:60]}" for v in values):
            values = [f"fails: {error[:60]}"] + [""] * (len(values) - 1)
        lines.append(_row(cells + values))
    return "\n".join(lines)
