"""Transformers against the strongest CPU peers, in one process, as ratios to eager.

Models (random weights): BERT-base and DistilBERT (token ids and an attention mask of ones,
sequence 128; :func:`bench.models.zoo.hf_text`), ViT-small/16 (224x224) and GPT-2 small
(sequence 128, no cache), at batch 1 (and 8 with ``--batch 1,8``); any other registered model
by name. Variants: ``eager``; ``inductor`` (freezing); ``ov_f32`` and ``ov_bf16`` (OpenVINO's
conversion with that hint; bf16 is OpenVINO's own choice on a CPU with AVX512_BF16);
``nncf_int8`` (NNCF ``ModelType.TRANSFORMER`` on the same 4 calibration batches, default
hints); ours float, bf16 and INT8 on each CPU target (``ours-fp32@onnxruntime``,
``ours-int8@openvino``, ...). Everything runs under ``torch.inference_mode``, each variant
built and called once, then all timed together (:func:`bench.suites.common.measure`); each of
ours compiles into a fresh cache, so its first call is a cold compile.
"""

from __future__ import annotations

import argparse
import gc
import tempfile

import torch

from bench import models
from bench.harness.record import Record
from bench.harness.table import by_variant
from bench.suites.common import measure, split_names
from bench.variants import Case, check_names

__all__ = ["BASELINE", "arguments", "run", "smoke", "table"]

BASELINE = "eager"
TEXT = ("bert_base", "distilbert", "gpt2")
VARIANTS = (
    "eager",
    "inductor",
    "ov_f32",
    "ov_bf16",
    "nncf_int8",
    "ours-fp32@onnxruntime",
    "ours-fp32@openvino",
    "ours-bf16@openvino",
    "ours-int8@onnxruntime",
    "ours-int8@openvino",
)


def arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's options."""
    parser.add_argument("--models", default="bert_base,distilbert,vit_small,gpt2")
    parser.add_argument("--batch", default="1", help="comma-separated batch sizes")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--backend", default="embedl_tensorrt", help="ours without a @target")


def smoke(args: argparse.Namespace) -> None:
    """The tiny CNN, batch 1, one round, eager against ours on each runtime."""
    args.models, args.batch, args.rounds = "tiny_cnn", "1", 1
    args.variants = "eager,ours-fp32@onnxruntime,ours-fp32@openvino"


def _calibration(inputs: tuple[torch.Tensor, ...], count: int = 4) -> list[tuple]:
    """Random batches like ``inputs``: normal floats, token ids below 20,000, masks kept."""
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(count):
        batch = []
        for x in inputs:
            if x.dtype.is_floating_point:
                batch.append(torch.randn(x.shape, generator=generator))
            elif x.max() <= 1:  # an attention mask
                batch.append(x)
            else:
                batch.append(torch.randint(0, 20000, x.shape, generator=generator))
        batches.append(tuple(batch))
    return batches


def _build(name: str, batch: int):
    if name in TEXT:
        from bench.models.zoo import hf_text

        return hf_text(name, batch)
    model, (x, *rest) = models.build(name)
    return model, (x.expand(batch, *x.shape[1:]).contiguous(), *rest)


def run(args: argparse.Namespace, record: Record) -> None:
    """One row per model and batch size; each model's caches go when it is done."""
    variants = split_names(args.variants)
    check_names(variants)
    for batch in (int(b) for b in split_names(args.batch)):
        for name in split_names(args.models):
            model, inputs = _build(name, batch)
            family = "transformer" if name in TEXT else models.family(name)
            with tempfile.TemporaryDirectory(prefix="embedl_bench_transformers_") as workdir:
                case = Case(model, inputs, _calibration(inputs), family, workdir, args.backend)
                measure(
                    record,
                    case,
                    variants,
                    model=name,
                    params={"batch": batch},
                    rounds=args.rounds,
                    mode=torch.inference_mode,
                )
                del case, model
                torch._dynamo.reset()
                gc.collect()
            print(f"{name} batch {batch}: done", flush=True)


def table(record: Record, view: str = "main") -> str:
    """``main``: time / eager; ``cosine``; ``first_call``: seconds, compile included."""
    if view == "cosine":
        return by_variant(record, "cosine", show="value")
    if view == "first_call":
        return by_variant(record, "first_call", show="value")
    return by_variant(record, "latency")
