"""The per-layer choice of ``precision="mixed"`` on a CNN, recorded as JSON and drawn.

``torch.compile(model, backend=..., options={"precision": "mixed", ...})`` is called once on a
CNN (random weights, BatchNorm statistics randomised as the tests do, 4 random calibration
batches); the compile report's per-layer records (``last_report()[0].pipeline["layers"]``:
each layer's precision, reason, and its profiled float and INT8 times on the runtime) are
written with the date, machine, versions and this command. ``--plot`` draws them: one bar
pair per layer, float against INT8 milliseconds (INT8 including its share of the Q/DQ), the
layer's name coloured by the precision ``mixed`` gave it. ``--from-json`` draws a recorded
file again without compiling.

Usage::

    python -m bench.bench_mixed_layers [--model mobilenet_like] [--size 160]
        [--backend embedl_onnxruntime] [--json out.json] [--plot out.png]
    python -m bench.bench_mixed_layers --from-json bench/results/mixed_layers.json --plot docs/mixed_layers.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["MODELS", "plot", "record"]

# small test models (tests/models.py); any CNN of bench/zoo.py is taken too (``[bench]`` extra)
MODELS = {"resnet_like": "ResNetLike", "mobilenet_like": "MobileNetLike"}


def _build(name: str, size: int, width: int) -> tuple[torch.nn.Module, tuple[int, ...]]:
    """The model and its input shape: a test model, or a ``bench/zoo.py`` CNN at 224."""
    if name in MODELS:
        from tests import models

        cls = getattr(models, MODELS[name])
        model = cls(width=width) if name == "resnet_like" else cls()
        return model.eval(), (1, 3, size, size)
    from bench.zoo import ZOO

    model, example = ZOO[name][1]()
    return model.eval(), tuple(example[0].shape)


def record(name: str, size: int, width: int, backend: str, budget: float | None) -> dict:
    """Compile ``name`` at ``mixed`` once; return the report's layers with where they ran."""
    import embedl_dynamo
    from embedl_dynamo.cache.keys import cpu_name

    torch.manual_seed(0)
    model, shape = _build(name, size, width)
    example = torch.randn(shape)
    calibration = [(torch.randn(shape),) for _ in range(4)]
    options = {"precision": "mixed", "calibration_data": calibration}
    if budget is not None:
        options["accuracy_budget"] = budget
    with tempfile.TemporaryDirectory(prefix="embedl_bench_mixed_") as cache:
        compiled = torch.compile(model, backend=backend, options={**options, "cache_dir": cache})
        with torch.inference_mode():
            compiled(example)
        sub = embedl_dynamo.last_report()[0]
    return {
        "command": "python -m bench.bench_mixed_layers " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{cpu_name()}, {torch.get_num_threads()} threads",
        "versions": {"torch": torch.__version__, "embedl_dynamo": embedl_dynamo.__version__},
        "model": name,
        "input": list(shape),
        "backend": backend,
        "runtime": sub.runtime,
        "layers": [dict(r) for r in sub.pipeline.get("layers", [])],
    }


COLORS = {"int8": "tab:green", "bf16": "tab:orange", "fp16": "tab:orange", "fp32": "tab:blue"}


def _float_ms(record: dict) -> float | None:
    """The layer's time in the float type its rest ran in (fp32, or the half type)."""
    for key in ("latency_fp32_ms", "latency_bf16_ms", "latency_fp16_ms"):
        if record.get(key) is not None:
            return record[key]
    return None


def plot(document: dict, path: str | Path) -> None:
    """Horizontal bar pairs per layer: float ms and INT8 ms, the label coloured by the choice."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [
        r for r in document["layers"]
        if _float_ms(r) is not None and r.get("latency_int8_ms") is not None
    ]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(layers) + 1.8))
    ys = range(len(layers))
    ax.barh([y - 0.2 for y in ys], [_float_ms(r) for r in layers], 0.4,
            label="float ms (fp32, or the half type of the rest)", color="tab:blue")  # fmt: skip
    ax.barh([y + 0.2 for y in ys], [r["latency_int8_ms"] for r in layers], 0.4,
            label="INT8 ms (incl. its share of Q/DQ)", color="tab:green")  # fmt: skip
    ax.set_yticks(list(ys), [f"{r['id'].split('@', 1)[-1]} -> {r['precision']}" for r in layers],
                  fontsize=7)  # fmt: skip
    for tick, r in zip(ax.get_yticklabels(), layers):
        tick.set_color(COLORS.get(r["precision"], "black"))
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("per-layer time on the runtime's profiler (ms, log scale)", fontsize=8)
    chosen = sum(r["precision"] == "int8" for r in document["layers"])
    ax.set_title(
        f"mixed on {document['model']} {tuple(document['input'])}, {document['runtime']}: "
        f"{chosen}/{len(document['layers'])} layers INT8 (each name: the precision chosen)\n"
        f"{document['date']}, {document['machine']}",
        fontsize=8,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="mobilenet_like", help=f"{', '.join(MODELS)} or a bench/zoo.py CNN"
    )
    parser.add_argument("--size", type=int, default=160, help="input height and width")
    parser.add_argument("--width", type=int, default=48, help="resnet_like's base width")
    parser.add_argument("--backend", default="embedl_onnxruntime")
    parser.add_argument("--accuracy-budget", type=float)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the record here")
    parser.add_argument("--from-json", help="draw this record instead of compiling")
    parser.add_argument("--plot", help="write a PNG of the per-layer choice")
    args = parser.parse_args()
    if args.from_json:
        document = json.loads(Path(args.from_json).read_text())
    else:
        torch.set_num_threads(args.threads)
        document = record(args.model, args.size, args.width, args.backend, args.accuracy_budget)
        print(json.dumps(document, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    if args.plot:
        plot(document, args.plot)


if __name__ == "__main__":
    main()
