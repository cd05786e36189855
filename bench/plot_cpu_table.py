"""Draw the CPU precision table (``bench/bench_cpu_table.py --json``) as a bar chart.

One panel per batch size; for each model, our four precisions beside the peer each is
compared with (OpenVINO f32, OpenVINO's default hints, the faster of NNCF + OpenVINO's two
INT8 builds), every bar the time as a ratio to eager PyTorch in the same rounds (lower is
faster). It reads the rows the benchmark wrote, either as the bare list ``--json`` writes or as
a recorded result (``bench/results/cpu_table_*.json``: the rows with the date, machine and
command that produced them), and draws nothing by hand.

Usage::

    python bench/plot_cpu_table.py bench/results/cpu_table_2026-11-27.json -o docs/cpu_table.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["BARS", "load_rows", "plot"]

# (label, row keys: the smallest of them is drawn, hatched for a peer)
BARS = (
    ("OpenVINO f32", ("ov_f32",), True),
    ("ours fp32", ("fp32",), False),
    ("OpenVINO default (bf16)", ("ov_default",), True),
    ("ours bf16", ("bf16",), False),
    ("NNCF+OpenVINO int8 (faster hint)", ("nncf_int8", "nncf_int8_f32"), True),
    ("ours int8", ("int8",), False),
    ("ours mixed", ("mixed",), False),
)


def load_rows(path: str | Path) -> tuple[list[dict], str]:
    """The table's rows and a title (date and machine where the file records them)."""
    document = json.loads(Path(path).read_text())
    if isinstance(document, list):
        return document, "CPU precision table"
    title = f"CPU precision table, {document.get('date', '')}, {document.get('machine', '')}"
    return document["rows"], title


def _value(row: dict, keys: tuple[str, ...]) -> float | None:
    values = [row[f"{k}_x_eager"] for k in keys if f"{k}_x_eager" in row]
    return min(values) if values else None


def plot(rows: list[dict], title: str, path: str | Path) -> None:
    """Write the chart: a panel per batch size, a group of bars per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows if "error" not in r})
    fig, axes = plt.subplots(len(batches), 1, figsize=(11, 3.2 * len(batches)), squeeze=False)
    width = 0.8 / len(BARS)
    colors = plt.get_cmap("tab10")
    for ax, batch in zip(axes[:, 0], batches):
        these = [r for r in rows if r["batch"] == batch and "error" not in r]
        for i, (label, keys, peer) in enumerate(BARS):
            xs = [m + (i - len(BARS) / 2 + 0.5) * width for m in range(len(these))]
            ys = [_value(r, keys) or 0.0 for r in these]
            ax.bar(xs, ys, width, label=label, color=colors(i // 2 if i < 6 else 3),
                   hatch="//" if peer else None, alpha=0.55 if peer else 1.0,
                   edgecolor="black", linewidth=0.3)  # fmt: skip
        top = max((_value(r, k) or 0.0) for r in these for _, k, _ in BARS)
        ax.set_ylim(0, top * 1.35)  # room for the legend
        ax.set_xticks(range(len(these)), [r["model"] for r in these], fontsize=8)
        ax.set_ylabel(f"time / eager, batch {batch}", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].set_title(f"{title} (lower is faster)", fontsize=9)
    axes[0, 0].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="rows from bench_cpu_table.py --json, or a recorded result")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    args = parser.parse_args()
    rows, title = load_rows(args.json)
    plot(rows, title, args.output)


if __name__ == "__main__":
    main()
