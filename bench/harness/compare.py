"""``python -m bench compare A.json B.json``: two records side by side, as pyperf's compare_to.

Rows are matched by model, params, variant and metric. For a time, the change is taken
between the two runs' ratios to their own baseline where both have one (each measured
against eager in the same rounds, so a machine that is slower in one run does not show up as
a change), else between the values; a change within ``noise`` (3%: the spread seen here
between identical artifacts timed in one process) is marked so. Where the environment blocks
differ (versions, CPU, threads, commit) the differences are listed first.
"""

from __future__ import annotations

import json

from bench.harness.environment import machine_line
from bench.harness.record import TIME_UNITS, Record
from bench.harness.table import number, param_text

__all__ = ["NOISE", "compare", "environment_differences"]

NOISE = 0.03


def environment_differences(a: Record, b: Record) -> list[str]:
    """One line per environment field that differs between the two records."""
    lines = []
    ea, eb = a.environment, b.environment
    for name in sorted(set(ea.get("versions", {})) | set(eb.get("versions", {}))):
        va, vb = ea.get("versions", {}).get(name), eb.get("versions", {}).get(name)
        if va != vb:
            lines.append(f"- {name}: {va or 'absent'} -> {vb or 'absent'}")
    if machine_line(ea) != machine_line(eb):
        lines.append(f"- machine: {machine_line(ea)} -> {machine_line(eb)}")
    if ea.get("threads") != eb.get("threads"):
        lines.append(f"- threads: {ea.get('threads')} -> {eb.get('threads')}")
    if ea.get("commit") != eb.get("commit"):
        lines.append(f"- commit: {str(ea.get('commit'))[:12]} -> {str(eb.get('commit'))[:12]}")
    return lines


def _key(row: dict) -> tuple:
    return row["model"], json.dumps(row["params"], sort_keys=True), row["variant"], row["metric"]


def _verdict(row_a: dict, row_b: dict, noise: float) -> tuple[str, str]:
    """(the change as a cell, the verdict) of one matched pair."""
    if row_a["ratio"] is not None and row_b["ratio"] is not None and row_a["ratio"]:
        change, basis = row_b["ratio"] / row_a["ratio"], "ratio"
    elif row_a["value"]:
        change, basis = row_b["value"] / row_a["value"], "value"
    else:
        return "-", ""
    if row_a["unit"] not in TIME_UNITS:
        return f"{change:.3f}x ({basis})", ""
    if abs(change - 1.0) <= noise:
        verdict = "within noise"
    else:
        verdict = "slower" if change > 1.0 else "faster"
    return f"{change:.3f}x ({basis})", verdict


def compare(a: Record, b: Record, noise: float = NOISE) -> str:
    """The comparison as Markdown: environment differences, then one line per matched row."""
    out = [
        f"A: {a.suite}, {a.environment['date']}, {machine_line(a.environment)}",
        f"B: {b.suite}, {b.environment['date']}, {machine_line(b.environment)}",
    ]
    differences = environment_differences(a, b)
    if differences:
        out += ["", "Environment differences:", *differences]
    rows_a = {_key(r): r for r in a.rows if r["value"] is not None}
    rows_b = {_key(r): r for r in b.rows if r["value"] is not None}
    out += [
        "",
        "| model | params | variant | metric | A | B | B / A | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, row_a in rows_a.items():
        row_b = rows_b.get(key)
        if row_b is None:
            continue
        change, verdict = _verdict(row_a, row_b, noise)
        unit = f" {row_a['unit']}" if row_a["unit"] else ""
        out.append(
            f"| {row_a['model']} | {param_text(row_a['params'])} | {row_a['variant']} | "
            f"{row_a['metric']} | {number(row_a['value'])}{unit} | {number(row_b['value'])}"
            f"{unit} | {change} | {verdict} |"
        )
    only_a, only_b = set(rows_a) - set(rows_b), set(rows_b) - set(rows_a)
    if only_a or only_b:
        out += ["", f"rows only in A: {len(only_a)}; only in B: {len(only_b)}"]
    return "\n".join(out)
