"""The CPU precision table: every precision of ours against the best CPU peer at it.

For each model (random weights, BatchNorm statistics settled on random batches) and batch
size, in ONE process, every variant is built and called once (:func:`bench.suites.common
.measure`: first-call seconds, cosine to eager, memory held), then all are timed together by
the one timer, each time a ratio to eager PyTorch in the same rounds:

* peers: OpenVINO's own conversion with the f32 hint (``ov_f32``) and its default hints
  (``ov_default``: bf16 on a CPU with AVX512_BF16 or AMX); NNCF + OpenVINO INT8 with the
  default hints (``nncf_int8``) and the f32 hint (``nncf_int8_f32``); ONNX Runtime's
  ``quantize_static`` (``ort_int8``, models of one input); inductor with freezing;
* ours: ``ours-fp32``, ``ours-bf16``, ``ours-int8``, ``ours-mixed`` through ``--backend``
  (``embedl_tensorrt``) under ``runtime="auto"``.

The calibrating variants see the same 4 random batches. Models are built one at a time and a
row's runtimes freed before the next; Dynamo is reset only between rows. The summary table
compares ours with the best peer at the same precision (fp32: OpenVINO f32 and inductor; bf16:
OpenVINO's default; int8: NNCF + OpenVINO and ``quantize_static``; mixed: OpenVINO's default)
and ``mixed`` with the best of our single precisions; within 3% of 1.0 is within noise, the
spread seen here between identical artifacts timed in one process. ``--smoke``: a tiny CNN,
batch 1, one round, :data:`SMOKE`'s variants (inductor's compile alone takes longer), seconds.

Install the peers with ``pip install -c constraints.txt -e ".[bench]" nncf``.
"""

from __future__ import annotations

import argparse
import gc
import tempfile

import torch

from bench import models
from bench.harness.measure import batched, calibration_batches, one_line
from bench.harness.record import Record
from bench.harness.table import by_variant, number
from bench.suites.common import measure, split_names
from bench.variants import Case, check_names

__all__ = ["BASELINE", "LABELS", "PEERS_OF", "arguments", "plot", "run", "smoke", "table"]

BASELINE = "eager"
MODELS = (
    "resnet50",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "convnext_tiny",
    "vit_small",
    "bert_base",
)
OURS = ("ours-fp32", "ours-bf16", "ours-int8", "ours-mixed")
PEERS = ("ov_f32", "ov_default", "nncf_int8", "nncf_int8_f32", "ort_int8", "inductor")
LABELS = {
    "ov_f32": "OpenVINO f32",
    "ov_default": "OpenVINO default",
    "nncf_int8": "NNCF+OV int8",
    "nncf_int8_f32": "NNCF+OV int8 f32 hint",
    "ort_int8": "ORT quantize_static",
    "inductor": "inductor+freezing",
    **{p: p.replace("-", " ") for p in OURS},
}
# our precision -> the peers it is compared with (the best of them that ran)
PEERS_OF = {
    "ours-fp32": ("ov_f32", "inductor"),
    "ours-bf16": ("ov_default",),
    "ours-int8": ("nncf_int8", "nncf_int8_f32", "ort_int8"),
    "ours-mixed": ("ov_default",),
}
NOISE = 0.03
# --smoke: eager, a peer of each kind and ours in float and INT8
SMOKE = ("eager", "ov_f32", "ort_int8", "ours-fp32", "ours-int8")


def arguments(parser: argparse.ArgumentParser) -> None:
    """The table's options."""
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--backend", default="embedl_tensorrt", help="our dynamo backend")
    parser.add_argument("--variants", default=",".join(("eager", *PEERS, *OURS)))
    parser.add_argument("--skip", default="", help="variants to leave out")
    parser.add_argument(
        "--accuracy-budget",
        type=float,
        help="our accuracy_budget (default: the library's); random-weight CNNs on 4 random "
        "calibration batches reach only about the peers' cosines",
    )
    parser.add_argument(
        "--no-memory", action="store_true", help="leave out the memory each build left held"
    )
    parser.add_argument(
        "--dict-tag-guards",
        action="store_true",
        help="torch._dynamo.config.use_recursive_dict_tags_for_guards for every compile",
    )


def smoke(args: argparse.Namespace) -> None:
    """A tiny CNN, batch 1, one round, one variant of each kind, no memory rows (seconds)."""
    args.models, args.batch, args.rounds = "tiny_cnn", "1", 1
    args.variants, args.no_memory = ",".join(SMOKE), True


def _row(record: Record, name: str, model, example, batch: int, args, workdir: str) -> None:
    torch.manual_seed(batch)
    inputs = batched(example, batch)
    case = Case(
        model,
        inputs,
        calibration_batches(inputs),
        models.family(name),
        workdir,
        args.backend,
        args.accuracy_budget,
    )
    variants = [v for v in split_names(args.variants) if v not in split_names(args.skip)]
    try:
        measure(
            record,
            case,
            variants,
            model=name,
            params={"batch": batch},
            rounds=args.rounds,
            memory=not args.no_memory,
        )
    finally:
        del case
        torch._dynamo.reset()
        gc.collect()


def run(args: argparse.Namespace, record: Record) -> None:
    """One row per model and batch size (each model built once, then freed)."""
    check_names(split_names(args.variants))
    torch._dynamo.config.use_recursive_dict_tags_for_guards = args.dict_tag_guards
    for name in split_names(args.models):
        try:
            model, example = models.build(name)
        except Exception as error:  # a model that does not build is a row, not the end
            record.fail(name, "eager", f"model: {one_line(error)}")
            continue
        with tempfile.TemporaryDirectory(prefix=f"embedl_bench_table_{name}_") as workdir:
            for batch in (int(b) for b in split_names(args.batch)):
                _row(record, name, model, example, batch, args, workdir)
                print(f"{name} batch {batch}: done", flush=True)
        del model
        gc.collect()


def _summary_cell(record: Record, model: str, params: dict, ours: str, peers) -> str:
    mine = record.find(model=model, variant=ours, metric="latency", params=params)
    if not mine or mine[0]["ratio"] is None:
        return f"{ours} did not run"
    ran = [
        r
        for p in peers
        for r in record.find(model=model, variant=p, metric="latency", params=params)
        if r["ratio"]
    ]
    if not ran:
        return "no peer ran"
    best = min(ran, key=lambda r: r["ratio"])
    value = mine[0]["ratio"] / best["ratio"]
    label = LABELS.get(best["variant"], best["variant"])
    text = f"{value:.2f} vs {label}"
    return f"{text}, within noise" if abs(value - 1.0) <= NOISE else text


def _info(record: Record, model: str, params: dict, variant: str, key: str) -> str:
    found = record.find(model=model, variant=variant, metric="latency", params=params)
    return str((found[0].get("info") or {}).get(key, "-")) if found else "-"


def summary(record: Record) -> str:
    """Ours / best peer at each precision, mixed / best of ours, where ours ran, INT8 layers."""
    lines = [
        "| model | batch | fp32 | bf16 | int8 | mixed / OpenVINO default | mixed / best of ours | "
        "ours runs on (fp32; bf16; int8; mixed) | INT8 layers (int8; mixed) | "
        "first call s (fp32/bf16/int8/mixed) |",
        "|" + "---|" * 10,
    ]
    groups = {(r["model"], r["params"]["batch"]): r["params"] for r in record.rows}
    for (model, batch), params in groups.items():
        cells = [_summary_cell(record, model, params, o, PEERS_OF[o]) for o in OURS]
        cells.append(_summary_cell(record, model, params, "ours-mixed", OURS[:3]))
        cells.append("; ".join(_info(record, model, params, o, "where") for o in OURS))
        cells.append("; ".join(_info(record, model, params, o, "int8_layers") for o in OURS[2:]))
        firsts = [record.value(model, o, "first_call", params) for o in OURS]
        cells.append("/".join(number(f) for f in firsts))
        lines.append(f"| {model} | {batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(record: Record, view: str = "main") -> str:
    """``main``: time / eager; ``cosine``: cosine to eager; ``summary``: ours against peers."""
    if view == "summary":
        return summary(record)
    if view == "cosine":
        return by_variant(record, "cosine", show="value", labels=LABELS)
    return by_variant(record, "latency", labels=LABELS)


# (label, variants: the fastest of them is drawn, hatched for a peer)
BARS = (
    ("OpenVINO f32", ("ov_f32",), True),
    ("ours fp32", ("ours-fp32",), False),
    ("OpenVINO default (bf16)", ("ov_default",), True),
    ("ours bf16", ("ours-bf16",), False),
    ("NNCF+OpenVINO int8 (faster hint)", ("nncf_int8", "nncf_int8_f32"), True),
    ("ours int8", ("ours-int8",), False),
    ("ours mixed", ("ours-mixed",), False),
)


def plot(record: Record, path) -> None:
    """A panel per batch size; per model, each precision of ours beside its peer (ratios)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.harness.plot import title

    def value(model: str, params: dict, variants) -> float:
        found = [
            r["ratio"]
            for v in variants
            for r in record.find(model=model, variant=v, metric="latency", params=params)
            if r["ratio"]
        ]
        return min(found) if found else 0.0

    groups = {
        (r["model"], r["params"]["batch"]): r["params"]
        for r in record.rows
        if r["metric"] == "latency"
    }
    batches = sorted({b for _, b in groups})
    fig, axes = plt.subplots(len(batches), 1, figsize=(11, 3.2 * len(batches)), squeeze=False)
    width, colors = 0.8 / len(BARS), plt.get_cmap("tab10")
    for ax, batch in zip(axes[:, 0], batches):
        these = [(m, p) for (m, b), p in groups.items() if b == batch]
        for i, (label, variants, peer) in enumerate(BARS):
            xs = [m + (i - len(BARS) / 2 + 0.5) * width for m in range(len(these))]
            ys = [value(m, p, variants) for m, p in these]
            ax.bar(
                xs,
                ys,
                width,
                label=label,
                color=colors(i // 2 if i < 6 else 3),
                hatch="//" if peer else None,
                alpha=0.55 if peer else 1.0,
                edgecolor="black",
                linewidth=0.3,
            )
        top = max([value(m, p, v) for m, p in these for _, v, _ in BARS] + [1.0])
        ax.set_ylim(0, top * 1.35)  # room for the legend
        ax.set_xticks(range(len(these)), [m for m, _ in these], fontsize=8)
        ax.set_ylabel(f"time / eager, batch {batch}", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].set_title(title(record, "CPU precision table") + " (lower is faster)", fontsize=9)
    axes[0, 0].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
