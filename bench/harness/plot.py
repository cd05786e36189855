"""``python -m bench plot RECORD.json -o out.png``: a record drawn as bars, never by hand.

A suite or probe with a chart of its own (the CPU table's peer-beside-ours bars, the LLM
roofline, the per-layer ``mixed`` choice) draws it; any other record is drawn here: one group
of bars per model and params, a bar per variant, each its ratio to the baseline (or its value)
for one metric. The title carries the record's date and machine.
"""

from __future__ import annotations

from pathlib import Path

from bench.harness import plugins
from bench.harness.environment import machine_line
from bench.harness.record import Record
from bench.harness.table import groups, param_text

__all__ = ["bars", "plot", "title"]


def title(record: Record, what: str) -> str:
    """``what`` with the record's date and machine."""
    date = str(record.environment.get("date", ""))[:10]
    return f"{what}, {date}, {machine_line(record.environment)}"


def bars(record: Record, path: str | Path, metric: str | None = None) -> None:
    """The generic chart: a group per model and params, a bar per variant of ``metric``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if metric is None:
        timed = [r["metric"] for r in record.rows if r["ratio"] is not None]
        metric = timed[0] if timed else next(r["metric"] for r in record.rows if r["value"])
    rows = [r for r in record.rows if r["metric"] == metric and r["value"] is not None]
    show = "ratio" if any(r["ratio"] is not None for r in rows) else "value"
    variants = [
        v
        for v in dict.fromkeys(r["variant"] for r in rows)
        if not (show == "ratio" and v == record.baseline)
    ]
    lines = groups(record, rows)
    width = 0.8 / max(1, len(variants))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(lines) + 2), 4))
    for i, variant in enumerate(variants):
        values = []
        for model, params in lines:
            found = record.find(model=model, variant=variant, metric=metric, params=params)
            values.append((found[0][show] or 0.0) if found else 0.0)
        ax.bar([j + i * width for j in range(len(lines))], values, width, label=variant)
    if show == "ratio":
        ax.axhline(1.0, color="grey", lw=0.8)
    labels = [f"{m} {param_text(p)}".strip() for m, p in lines]
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(lines))], labels, fontsize=8)
    what = f"{metric} / {record.baseline} (lower is faster)" if show == "ratio" else metric
    ax.set_ylabel(what, fontsize=8)
    ax.set_title(title(record, record.suite), fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(record: Record, path: str | Path, metric: str | None = None) -> None:
    """Draw ``record`` to ``path``: its plug-in's chart where it has one, else :func:`bars`."""
    module = plugins.plugin(record.suite)
    if metric is None and hasattr(module, "plot"):
        module.plot(record, path)
    else:
        bars(record, path, metric)
