"""Transformers against the strongest CPU peers, in one process, as ratios to eager.

Models (random weights): BERT-base and DistilBERT (sequence 128), ViT-small/16 (224²) and GPT-2
small (sequence 128, no cache), at batch 1 (and 8 with ``--batches 1,8``). Variants:

* ``eager``: PyTorch;
* ``inductor``: ``torch.compile`` with ``torch._inductor.config.freezing = True``;
* ``openvino``: ``ov.convert_model`` + ``compile_model(..., INFERENCE_PRECISION_HINT=f32)``;
  ``openvino_bf16``: the same with ``bf16``, OpenVINO's own choice on this CPU (AVX512_BF16);
* ``nncf_int8``: NNCF ``quantize`` (``ModelType.TRANSFORMER``) of that model on the same 4
  calibration batches, compiled the same way (``nncf_int8_bf16``: with the ``bf16`` hint; on
  BERT-base no faster, 0.217x against 0.213x eager);
* ``ours_ort`` / ``ours_ov``: our ``torch.compile`` backend, float on ONNX Runtime / on
  OpenVINO; ``ours_ov_bf16``: ``precision="bf16"`` on OpenVINO (computed in bf16 where the CPU
  can); ``ours_ort_int8`` / ``ours_ov_int8``: ``precision="int8"`` on each, with the
  placement of the target (``embedl_onnxruntime`` for ONNX Runtime's integer kernels,
  ``embedl_tensorrt``'s symmetric input-side Q/DQ, which NNCF also uses, for OpenVINO).

Latencies are medians timed round-robin in this process (each variant called three times per
round, the last two timed, the order rotating each round, a 50 ms pause between variants so one
runtime's spinning worker threads do not bill the next), as ratios to eager; cosine of the
first output to eager; first-call seconds (compile included). Targets (issue 10): our float <=
0.9x the best float peer, our INT8 <= 1.0x NNCF + OpenVINO on BERT-base and ViT-small, cosine >=
0.999 float and >= 0.99 INT8, cold compile <= 5 s.

Usage::

    pip install -c constraints.txt -e ".[bench]"
    python bench/bench_transformers.py [--models bert_base,vit_small] [--batches 1,8]
        [--variants eager,ours_ort,...] [--rounds 8] [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import embedl_dynamo  # noqa: E402
from bench.measure import cosine, first_tensor, round_robin_medians  # noqa: E402
from bench.peers import inductor_peer, openvino_peer  # noqa: E402
from bench.zoo import import_model_libraries  # noqa: E402
from embedl_dynamo import clear_reports  # noqa: E402

VARIANTS = (
    "eager",
    "inductor",
    "openvino",
    "openvino_bf16",
    "nncf_int8",
    "ours_ort",
    "ours_ov",
    "ours_ov_bf16",
    "ours_ort_int8",
    "ours_ov_int8",
)


class _Tuple(torch.nn.Module):
    """The model's first output tensor from positional inputs (what every peer is given)."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, args)))
        return first_tensor(out)


def _text(name: str, batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    config, cls = {
        "bert_base": (transformers.BertConfig(), transformers.BertModel),
        "distilbert": (transformers.DistilBertConfig(), transformers.DistilBertModel),
        "gpt2": (transformers.GPT2Config(use_cache=False), transformers.GPT2Model),
    }[name]
    config._attn_implementation = "sdpa"
    model = cls(config).eval()
    ids = torch.randint(0, 20000, (batch, 128))
    mask = torch.ones(batch, 128, dtype=torch.long)
    return _Tuple(model, ("input_ids", "attention_mask")).eval(), (ids, mask)


def _vit(batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import timm

    model = timm.create_model("vit_small_patch16_224", pretrained=False).eval()
    return model, (torch.randn(batch, 3, 224, 224),)


def build(name: str, batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import_model_libraries()
    torch.manual_seed(0)
    return _vit(batch) if name == "vit_small" else _text(name, batch)


def _calibration(inputs: tuple[torch.Tensor, ...], count: int = 4) -> list[tuple]:
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(count):
        batches.append(
            tuple(
                torch.randn(x.shape, generator=generator)
                if x.dtype.is_floating_point
                else (x if x.max() <= 1 else torch.randint(0, 20000, x.shape, generator=generator))
                for x in inputs
            )
        )
    return batches


def make_variant(name: str, model, inputs, calibration, cache_dir: str) -> Callable[[], object]:
    """The variant's call (built, not yet called)."""
    if name == "eager":
        return lambda: model(*inputs)
    if name == "inductor":
        return inductor_peer(model, inputs)
    if name.startswith(("openvino", "nncf_int8")):
        hint = "bf16" if name.endswith("bf16") else "f32"
        int8 = name.startswith("nncf_int8")
        return openvino_peer(
            model, inputs, calibration, int8, transformer=True, precision_hint=hint
        )
    runtime = "openvino" if "_ov" in name else "onnxruntime"
    # a fresh cache directory per variant: first-call seconds are a cold compile
    options = {"runtime": runtime, "cache_dir": tempfile.mkdtemp(dir=cache_dir)}
    if name.endswith("int8"):
        options.update(precision="int8", calibration_data=calibration)
    elif name.endswith("bf16"):
        options.update(precision="bf16")
    # the target's INT8 placement: ONNX Runtime's integer kernels for ORT; symmetric Q/DQ on
    # layer inputs (what NNCF places too) for OpenVINO. Float: the same fusions either way.
    backend = "embedl_onnxruntime" if runtime == "onnxruntime" else "embedl_tensorrt"
    compiled = torch.compile(model, backend=backend, options=options)
    return lambda: compiled(*inputs)


def bench_model(name: str, batch: int, variants, rounds: int, cache_dir: str) -> dict:
    model, inputs = build(name, batch)
    calibration = _calibration(inputs)
    row: dict = {"model": name, "batch": batch}
    fns: dict[str, Callable[[], object]] = {}
    with torch.inference_mode():
        expected = first_tensor(model(*inputs))
        for variant in variants:
            torch._dynamo.reset()
            clear_reports()
            start = time.perf_counter()
            try:
                fn = make_variant(variant, model, inputs, calibration, cache_dir)
                got = first_tensor(fn())
            except Exception as exc:  # a peer that fails is a cell, not the end of the run
                row[f"{variant}_error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
                continue
            row[f"{variant}_first_s"] = round(time.perf_counter() - start, 1)
            embedl_dynamo.wait_for_cache_writes()  # ours writes its cache after the first call
            row[f"{variant}_cosine"] = round(cosine(got, expected), 5)
            if variant.startswith("ours"):
                row[f"{variant}_where"] = ",".join(
                    sorted({s.runtime for s in embedl_dynamo.last_report().subgraphs})
                )
            fns[variant] = fn
        gc.collect()
    medians = round_robin_medians(fns, rounds, torch.inference_mode)
    row["eager_ms"] = round(medians["eager"] * 1e3, 2)
    for key, median in medians.items():
        row[f"{key}_x_eager"] = round(median / medians["eager"], 3)
    return row


def table(rows: list[dict], variants) -> str:
    head = "| model | batch | eager ms | " + " | ".join(variants[1:]) + " |"
    lines = [head, "|" + "---|" * (len(variants) + 2)]
    for r in rows:
        cells = []
        for v in variants[1:]:
            if f"{v}_error" in r:
                cells.append(f"fails ({r[f'{v}_error'][:40]})")
            elif f"{v}_x_eager" in r:
                cells.append(
                    f"{r[f'{v}_x_eager']:.2f}x (cos {r[f'{v}_cosine']:.4f}, {r[f'{v}_first_s']} s)"
                )
            else:
                cells.append("")
        lines.append(
            f"| {r['model']} | {r['batch']} | {r.get('eager_ms', '')} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], variants, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']} bs{r['batch']}" for r in rows]
    shown = [v for v in variants[1:] if any(f"{v}_x_eager" in r for r in rows)]
    width = 0.8 / max(1, len(shown))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    for i, v in enumerate(shown):
        values = [r.get(f"{v}_x_eager", 0) for r in rows]
        ax.bar([j + i * width for j in range(len(rows))], values, width, label=v)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels)
    ax.set_ylabel("latency / eager (lower is faster)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert_base,distilbert,vit_small,gpt2")
    parser.add_argument("--batches", default="1")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache-dir", default="/tmp/embedl_bench_transformers")
    parser.add_argument("--json", help="also write the rows as JSON")
    parser.add_argument("--plot", help="write a PNG bar chart of the ratios")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
    variants = tuple(args.variants.split(","))
    assert variants[0] == "eager", "eager is the baseline: list it first"
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for name in args.models.split(","):
            # each model's caches go when it is done: a run that followed 13 GB of leftover
            # artifacts had cold compiles 1-2 s slower than one on a clean disk
            with tempfile.TemporaryDirectory(dir=args.cache_dir) as cache_dir:
                rows.append(bench_model(name, batch, variants, args.rounds, cache_dir))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows, variants))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot:
        plot(rows, variants, args.plot)


if __name__ == "__main__":
    main()
