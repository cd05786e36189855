"""The per-layer choice of ``precision="mixed"`` on a CNN, recorded and drawn.

``torch.compile(model, backend=..., options={"precision": "mixed", ...})`` is called once on a
CNN (random weights, BatchNorm statistics randomised as the tests do, 4 random calibration
batches); the compile report's per-layer records (``last_report()[0].pipeline["layers"]``:
each layer's precision, reason, and its profiled float and INT8 times on the runtime) become
rows: per layer (``variant``: the layer's name), its float milliseconds (fp32, or the half
type its rest ran in) and its INT8 milliseconds (with its share of the Q/DQ), the precision
``mixed`` gave it and why in the row's info. ``python -m bench plot`` draws them: one bar pair
per layer, the name coloured by the precision chosen. Models: ``resnet_like`` and
``mobilenet_like`` (``tests/models.py``), or a registered CNN at its own input size.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from bench.harness.record import Record
from bench.harness.table import by_metric

__all__ = ["BASELINE", "arguments", "plot", "run", "smoke", "table"]

BASELINE = None
# small test models (tests/models.py); any registered CNN is taken too
MODELS = {"resnet_like": "ResNetLike", "mobilenet_like": "MobileNetLike"}
COLORS = {"int8": "tab:green", "bf16": "tab:orange", "fp16": "tab:orange", "fp32": "tab:blue"}


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--model", default="mobilenet_like", help=f"{', '.join(MODELS)} or a CNN")
    parser.add_argument("--size", type=int, default=160, help="input height and width")
    parser.add_argument("--width", type=int, default=48, help="resnet_like's base width")
    parser.add_argument("--backend", default="embedl_onnxruntime")
    parser.add_argument("--accuracy-budget", type=float)


def smoke(args: argparse.Namespace) -> None:
    """The ResNet-style CNN at 32x32, width 8."""
    args.model, args.size, args.width = "resnet_like", 32, 8


def _build(name: str, size: int, width: int) -> tuple[torch.nn.Module, tuple[int, ...]]:
    if name in MODELS:
        from tests import models as test_models

        cls = getattr(test_models, MODELS[name])
        model = cls(width=width) if name == "resnet_like" else cls()
        return model.eval(), (1, 3, size, size)
    from bench import models

    model, example = models.build(name)
    return model.eval(), tuple(example[0].shape)


def _float_ms(layer: dict) -> float | None:
    """The layer's time in the float type its rest ran in (fp32, or the half type)."""
    for key in ("latency_fp32_ms", "latency_bf16_ms", "latency_fp16_ms"):
        if layer.get(key) is not None:
            return layer[key]
    return None


def run(args: argparse.Namespace, record: Record) -> None:
    """Compile at ``mixed`` once; a row pair per layer of the report."""
    import embedl_dynamo

    torch.manual_seed(0)
    model, shape = _build(args.model, args.size, args.width)
    calibration = [(torch.randn(shape),) for _ in range(4)]
    options = {"precision": "mixed", "calibration_data": calibration}
    if args.accuracy_budget is not None:
        options["accuracy_budget"] = args.accuracy_budget
    with tempfile.TemporaryDirectory(prefix="embedl_bench_mixed_") as cache:
        compiled = torch.compile(
            model, backend=args.backend, options={**options, "cache_dir": cache}
        )
        with torch.inference_mode():
            compiled(torch.randn(shape))
        sub = embedl_dynamo.last_report()[0]
    record.extra.update({"input": list(shape), "runtime": sub.runtime})
    for layer in sub.pipeline.get("layers", []):
        info = {"precision": layer["precision"], "reason": layer.get("reason", "")}
        name = layer["id"].split("@", 1)[-1]
        record.add(args.model, name, "float", _float_ms(layer), "ms", info=info)
        record.add(args.model, name, "int8", layer.get("latency_int8_ms"), "ms")


def table(record: Record, view: str = "main") -> str:
    """A line per layer: float and INT8 ms; the precision chosen is in the plot and info."""
    return by_metric(record, ("float", "int8"))


def plot(record: Record, path) -> None:
    """Horizontal bar pairs per layer: float ms and INT8 ms, the label coloured by the choice."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.harness.plot import title

    floats = {r["variant"]: r for r in record.find(metric="float")}
    int8 = {r["variant"]: r["value"] for r in record.find(metric="int8")}
    layers = [n for n, r in floats.items() if r["value"] is not None and int8.get(n) is not None]
    chosen = {n: (r.get("info") or {}).get("precision", "?") for n, r in floats.items()}
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(layers) + 1.8))
    ys = range(len(layers))
    ax.barh(
        [y - 0.2 for y in ys],
        [floats[n]["value"] for n in layers],
        0.4,
        label="float ms (fp32, or the half type of the rest)",
        color="tab:blue",
    )
    ax.barh(
        [y + 0.2 for y in ys],
        [int8[n] for n in layers],
        0.4,
        label="INT8 ms (incl. its share of Q/DQ)",
        color="tab:green",
    )
    ax.set_yticks(list(ys), [f"{n} -> {chosen[n]}" for n in layers], fontsize=7)
    for tick, n in zip(ax.get_yticklabels(), layers):
        tick.set_color(COLORS.get(chosen[n], "black"))
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("per-layer time on the runtime's profiler (ms, log scale)", fontsize=8)
    model = next(iter(floats.values()))["model"] if floats else "?"
    n_int8 = sum(p == "int8" for p in chosen.values())
    what = (
        f"mixed on {model} {tuple(record.extra.get('input', ()))}, "
        f"{record.extra.get('runtime', '?')}: {n_int8}/{len(chosen)} layers INT8"
    )
    ax.set_title(title(record, what), fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
