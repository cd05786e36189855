"""OpenVINO peer for ``bench/bench_llm.py``: decode ms per token through optimum-intel.

The same Qwen2.5-0.5B-shaped decoder as ``bench_llm.qwen2_0_5b`` (random weights from
``Qwen2Config``: hidden 896, intermediate 4864, grouped-query attention 14/2, vocab 151,936,
tied embeddings, ``torch.manual_seed(0)``), written with ``save_pretrained`` and converted by
``OVModelForCausalLM.from_pretrained(dir, export=True, ...)`` (a stateful model: the KV cache
lives in OpenVINO variables). Variants (``--variants``):

* ``fp32``: float weights, ``INFERENCE_PRECISION_HINT=f32``;
* ``default``: float weights, no precision hint (OpenVINO's default: bf16 on a CPU with
  avx512_bf16);
* ``int8`` / ``int4``: NNCF weight compression through ``OVWeightQuantizationConfig``
  (``bits=8``; ``bits=4, group_size=128, ratio=1.0``, asymmetric, data-free), no precision
  hint; ``int8-f32`` / ``int4-f32`` add ``INFERENCE_PRECISION_HINT=f32``. NNCF keeps the
  embedding and the last linear (the tied output head) at 8 bits by default: the table's
  per-variant line lists the weight-reading ops left at 8 bits, read from the converted model.

The table's precision and KV cache columns are what the compiled model reports (OpenVINO's
CPU plugin picks the KV cache precision itself: f16 under the f32 hint, u8 by default).

Every variant compiles with ``INFERENCE_NUM_THREADS=--threads`` (2). Measured as
``bench_llm.py`` does: batch 1, a 64-token prompt from a seeded generator, greedy,
``min_new_tokens = max_new_tokens``; per token = (time of N new tokens - time of 1) / (N - 1),
the median over ``--rounds`` rounds, variants interleaved round by round; time to first token =
the time of one new token. "convert s" is the whole ``from_pretrained`` call (export, weight
compression, compile). The roofline is the bytes of the weights the matmuls read (packed codes,
scales and zero points) over the read bandwidth of a large ``sum``.

This script runs in its own environment, not the project's: optimum-intel 2.2 pins
transformers < 5.6 and huggingface-hub < 1.22, below ``constraints.txt``. It does not import
``embedl_dynamo``; the model, prompt, timing and bandwidth probe are ``bench.bench_llm``'s
(which imports only torch and transformers). ``bash bench/peers_setup.sh optimum_intel`` makes
that environment (``torch==2.13.0`` first, so pip keeps the local CPU wheel; then
``optimum-intel[openvino,nncf]==2.2.0`` under ``constraints.txt`` less its transformers,
tokenizers and huggingface_hub pins): optimum-intel 2.2.0, openvino 2026.4.1, nncf 3.4.0,
transformers 5.5.4, torch 2.13.0+cpu.

``bench/bench_llm.py`` runs it as a peer (``--serve --model-dir DIR``: converting the model
that ``bench_llm.py`` saved, then timed round by round between our variants over
``bench/llm_peer_protocol.py``). Alone, it saves the model itself and times its variants.

Usage, from the repository root: ``~/.cache/embedl_dynamo_bench/peers/optimum_intel/bin/python
-m bench.bench_llm_openvino
[--layers 24] [--new-tokens 32 128] [--rounds 3] [--variants fp32 int8 int4] [--threads 2]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from bench.bench_llm import PROMPT, generate, qwen2_0_5b, read_bandwidth_gbs
from bench.zoo import import_model_libraries

# variant -> (weight bits or None for float, INFERENCE_PRECISION_HINT or None for the default)
VARIANTS = {"fp32": (None, "f32"), "default": (None, None), "int8": (8, None),
            "int4": (4, None), "int8-f32": (8, "f32"), "int4-f32": (4, "f32")}  # fmt: skip


def import_transformers():
    """Import transformers with the CPU torch (optimum-intel requires torchvision, whose only
    wheel here is a CUDA build that fails to import until its op schemas exist), quietly."""
    import_model_libraries()
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


def convert(name: str, model_dir: str, threads: int):
    """(OVModelForCausalLM, seconds of the whole ``from_pretrained``) for one variant."""
    import_transformers()
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig

    bits, hint = VARIANTS[name]
    ov_config = {"INFERENCE_NUM_THREADS": threads}
    if hint:
        ov_config["INFERENCE_PRECISION_HINT"] = hint
    if bits == 4:
        kw = {"quantization_config": OVWeightQuantizationConfig(bits=4, group_size=128, ratio=1.0)}
    elif bits == 8:
        kw = {"quantization_config": OVWeightQuantizationConfig(bits=8)}
    else:
        kw = {"load_in_8bit": False}  # never the size-based default compression
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = OVModelForCausalLM.from_pretrained(
            model_dir, export=True, device="CPU", ov_config=ov_config, **kw
        )
    return model, time.perf_counter() - start


def weight_constants(node) -> list:
    """The constants behind one weight input: through the decompression chain (Convert,
    Subtract, Multiply, Reshape, Transpose) down to Constant nodes."""
    kind = node.get_type_name()
    if kind == "Constant":
        return [node]
    if kind not in {"Convert", "Subtract", "Multiply", "Reshape", "Transpose", "Unsqueeze"}:
        return []
    found = []
    for port in node.inputs():
        found += weight_constants(port.get_source_output().get_node())
    return found


def weight_report(model) -> dict:
    """What the converted model's weights are: bytes a decode step reads through the matmuls
    (each constant once), matmul count by weight type, and the weight-reading ops (matmuls
    and the embedding Gather) whose largest constant is 8-bit."""
    matmul_bytes, by_type, eight_bit, seen = 0, {}, [], set()
    for op in model.model.get_ordered_ops():
        kind = op.get_type_name()
        if kind not in {"MatMul", "Gather"}:
            continue
        port = 1 if kind == "MatMul" else 0
        constants = weight_constants(op.input_value(port).get_node())
        constants = [c for c in constants if c.get_byte_size() >= 4096]
        if not constants:
            continue
        largest = max(constants, key=lambda c: c.get_byte_size())
        element = largest.get_output_element_type(0).get_type_name()
        name = op.get_friendly_name().removeprefix("__module.").split("/")[0]
        if kind == "MatMul":
            by_type[element] = by_type.get(element, 0) + 1
            matmul_bytes += sum(c.get_byte_size() for c in constants if c.get_name() not in seen)
            seen.update(c.get_name() for c in constants)
        if largest.get_output_element_type(0).bitwidth == 8:
            eight_bit.append(f"{name} ({kind}, {element})")
    return {"matmul_weight_bytes": matmul_bytes, "matmuls_by_weight_type": by_type,
            "kept_8bit": eight_bit}  # fmt: skip


def compiled_properties(model) -> dict:
    """The compiled model's precision, threads and KV cache precision, as OpenVINO reports."""
    compiled = model.request.get_compiled_model()
    names = ["INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "KV_CACHE_PRECISION"]
    properties = {}
    for name in names:
        try:
            value = compiled.get_property(name)
        except RuntimeError:
            value = "n/a"
        properties[name] = value.get_type_name() if hasattr(value, "get_type_name") else str(value)
    return properties


def build_variants(args, model_dir: str, ids) -> dict:
    """Convert each variant; return name -> (model, info) with its conversion seconds, first
    generate() seconds, compiled properties and weight report, each printed."""
    variants = {}
    for name in args.variants:
        model, seconds = convert(name, model_dir, args.threads)
        start = time.perf_counter()
        generate(model, ids, 4)
        info = {"convert_s": seconds, "first_generate_s": time.perf_counter() - start,
                "compiled": compiled_properties(model), **weight_report(model)}  # fmt: skip
        kept = info["kept_8bit"]
        listed = ", ".join(kept) if len(kept) <= 8 else f"{len(kept)} ops"
        print(f"{name}: converted in {seconds:.1f} s; {info['compiled']}; matmul weights "
              f"{info['matmuls_by_weight_type']}; 8-bit weights: {listed or 'none'}")  # fmt: skip
        variants[name] = (model, info)
        gc.collect()
    return variants


def time_rounds(variants: dict, ids, new_tokens: list[int], rounds: int) -> dict:
    """(variant, tokens) -> seconds of each round, variants interleaved as in bench_llm.py."""
    times = {(n, t): [] for n in variants for t in [1, *new_tokens]}
    names = list(variants)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            model = variants[name][0]
            for tokens in [1, *new_tokens]:
                start = time.perf_counter()
                generate(model, ids, tokens)
                times[(name, tokens)].append(time.perf_counter() - start)
    return times


def report(variants: dict, times: dict, new_tokens: list[int], bandwidth: float) -> list[dict]:
    """Print the markdown table; return its rows (``--json``)."""
    columns = " | ".join(f"ms/token ({n} new)" for n in new_tokens)
    print(f"| variant | {columns} | TTFT ms | convert s | precision | KV cache | "
          "matmul weights GB | roofline ms |")  # fmt: skip
    print("|---" * (len(new_tokens) + 7) + "|")
    rows = []
    for name, (_, info) in variants.items():
        ttft = statistics.median(times[(name, 1)])
        per_token = [
            (statistics.median(times[(name, n)]) - ttft) / (n - 1) * 1e3 for n in new_tokens
        ]
        weight_gb = info["matmul_weight_bytes"] / 1e9
        roofline = weight_gb / bandwidth * 1e3
        cells = " | ".join(f"{ms:.1f}" for ms in per_token)
        hint, kv = (info["compiled"][k] for k in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION"))
        print(f"| {name} | {cells} | {ttft * 1e3:.0f} | {info['convert_s']:.1f} | {hint} | {kv} | "
              f"{weight_gb:.2f} | {roofline:.1f} |")  # fmt: skip
        rows.append({"variant": name, "ms_per_token": dict(zip(new_tokens, per_token)),
                     "ttft_ms": ttft * 1e3, "weight_gb": weight_gb, "roofline_ms": roofline,
                     **info})  # fmt: skip
    return rows


class ServedVariant:
    """One converted model as ``bench/llm_peer_protocol.py`` times it (token ids in and out)."""

    def __init__(self, model) -> None:
        self.model = model

    def generate(self, prompt: list[int], tokens: int) -> list[int]:
        out = generate(self.model, torch.tensor([prompt]), tokens)
        return out[0, len(prompt) :].tolist()


def build_served(args) -> tuple[dict, dict]:
    """Each variant converted from ``--model-dir`` (``bench_llm.py``'s saved model), with the
    weight bytes its matmuls read as ``weight_bytes`` (see :func:`weight_report`)."""
    torch.set_num_threads(args.threads)
    ids = torch.randint(0, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    variants, info = {}, {}
    for name, (model, details) in build_variants(args, args.model_dir, ids).items():
        variants[name] = ServedVariant(model)
        info[name] = {**details, "weight_bytes": details["matmul_weight_bytes"],
                      "build_s": details["convert_s"], "versions": versions()}  # fmt: skip
    return variants, info


def versions() -> dict:
    from importlib.metadata import version

    packages = ["optimum-intel", "openvino", "nncf", "transformers", "torch"]
    return {name: version(name) for name in packages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=["fp32", "int8", "int4"],
                        choices=list(VARIANTS))  # fmt: skip
    parser.add_argument("--json", help="also write the rows as JSON")
    parser.add_argument(
        "--serve", action="store_true", help="be bench_llm.py's peer (bench/llm_peer_protocol.py)"
    )
    parser.add_argument("--model-dir", help="with --serve: the save_pretrained model to convert")
    args = parser.parse_args()
    if args.serve:
        from bench.llm_peer_protocol import serve

        serve(lambda: build_served(args))
        return
    torch.set_num_threads(args.threads)
    bandwidth = read_bandwidth_gbs()
    print(f"read bandwidth: {bandwidth:.1f} GB/s; layers {args.layers}; prompt {PROMPT}; "
          f"threads {args.threads}; {versions()}")  # fmt: skip
    ids = torch.randint(0, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as model_dir:
        import_transformers()
        qwen2_0_5b(args.layers).save_pretrained(model_dir)
        gc.collect()
        variants = build_variants(args, model_dir, ids)
    times = time_rounds(variants, ids, args.new_tokens, args.rounds)
    rows = report(variants, times, args.new_tokens, bandwidth)
    if args.json:
        result = {"bandwidth_gbs": bandwidth, "layers": args.layers, "threads": args.threads,
                  "prompt": PROMPT, "versions": versions(), "rows": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
