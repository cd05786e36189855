"""Decoder LLM generation: ms per token, time to first token, first-output time, roofline.

A Qwen2.5-0.5B-shaped decoder (random weights from ``Qwen2Config``: 24 layers, hidden 896,
grouped-query attention 14/2, vocab 151,936, tied embeddings), batch 1, a 64-token prompt,
greedy decoding, 2 threads. Variants run in one process, timed in interleaved rounds:

* ``eager``: transformers as it is (dynamic cache);
* ``inductor``: ``torch.compile(model.forward)`` with the static cache;
* ``ours-<precision>[@<dynamo backend>][+dynamic]``: ``torch.compile(model.forward,
  backend=...)`` at that precision (skipped when the registry does not have it), on
  ``--backend`` unless named; ``+dynamic`` passes ``dynamic=True`` (sizes symbolic from the
  first trace: no decode graph at the prompt's static cache length, unless ``--prompt`` equals
  another size of the model, such as the head dimension 64, which Dynamo's duck sizing then
  shares);
* the peers, each in its own venv (``bash bench/peers_setup.sh``; ``bench/llm_peers.py``), on
  the same model saved with ``save_pretrained``: ``llama.cpp-<f32|q8_0|q4_0>``
  (``bench/llm_peer_llama.py``: a GGUF written from it, quantized by llama.cpp) and
  ``openvino-<fp32|default|int8|int4|int8-f32|int4-f32>`` (optimum-intel's export,
  ``bench/bench_llm_openvino.py``). Each peer is one process, timed as one block of its
  variants in the same rotating rounds, on the same prompt; a peer without its venv is
  skipped with one line naming the command that makes it.

Per token = (time of N new tokens - time of 1) / (N - 1); time to first token = the time of
one new token (prefill and one step). First output = seconds until the first generated tokens:
our first ``generate()`` (compile included); a peer's conversion (GGUF writing and
quantization, or optimum-intel's export) and load, then its first generation. The roofline is
the bytes a decode step reads over the read bandwidth measured here (a large ``sum``, 2
threads): ours, every linear weight and the output head at the variant's bytes per weight;
llama.cpp, the GGUF's tensor bytes; OpenVINO, the bytes of the constants its matmuls read.
"x roofline" is ms per token (the last ``--new-tokens``) over that.

Usage: ``python -m bench.bench_llm [--layers 24] [--prompt 64] [--new-tokens 32 128] [--rounds 3]
[--variants eager inductor ours-fp32 llama.cpp-q4_0 openvino-int4 ...] [--backend
embedl_onnxruntime] [--accuracy-budget 0.5] [--json out.json] [--plot out.png]``

Random weights are no test of accuracy (``tests/dynamo/test_perplexity.py`` is): their int4
cosine to float falls below the default budget, which then keeps every linear at 8 bits, so
int4 rows need a lower ``--accuracy-budget`` to measure int4.
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

BYTES_PER_WEIGHT = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8_weight_only": 1.0,
                    "int4_weight_only": 0.5}  # fmt: skip
PROMPT = 64


def qwen2_0_5b(layers: int):
    """The Qwen2.5-0.5B shape with random weights (no download)."""
    import transformers

    from bench.zoo import import_model_libraries

    import_model_libraries()  # the bench extra's torchvision wheel breaks transformers' imports

    config = transformers.Qwen2Config(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).eval()


def read_bandwidth_gbs() -> float:
    """Bytes per second a large reduction reads here (the decode roofline's denominator)."""
    data = torch.ones(256 * 1024 * 1024 // 4 * 4)  # 1 GiB of float32
    data.sum()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / min(times) / 1e9


def decode_weight_bytes(model, precision: str, head_precision: str | None = None) -> float:
    """Weights a decode step reads: every linear weight and the output head, once, the head
    at ``head_precision`` where the report says it differs (int4 keeps it at 8 bits unless
    the accuracy budget allows 4)."""
    per_weight = BYTES_PER_WEIGHT.get(precision, 4.0)
    head = model.get_output_embeddings().weight.numel()
    count = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head_bytes = head * BYTES_PER_WEIGHT.get(head_precision or precision, per_weight)
    return (count - head) * per_weight + head_bytes


def generate(model, ids, new_tokens: int, **kw):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, **kw)  # fmt: skip


def parse_ours(name: str) -> tuple[str, str | None, bool]:
    """``(precision, dynamo backend or None, dynamic)`` of an ``ours-...`` variant name."""
    spec = name.removeprefix("ours-")
    dynamic = spec.endswith("+dynamic")
    precision, _, named = spec.removesuffix("+dynamic").partition("@")
    return precision, named or None, dynamic


def build_variant(
    name: str, layers: int, backend: str, budget: float | None = None, prompt: int = PROMPT
):
    """(model, generate kwargs, first-generate seconds) for one variant; ``budget`` is our
    ``accuracy_budget`` (the library's default when None)."""
    from embedl_dynamo.precision import precision_names

    model, kw = qwen2_0_5b(layers), {}
    if name == "inductor":
        model.forward = torch.compile(model.forward)
        kw = {"cache_implementation": "static"}
    elif name.startswith("ours-"):
        precision, named, dynamic = parse_ours(name)
        if precision not in precision_names():
            return None
        options = {"precision": precision}
        if budget is not None:
            options["accuracy_budget"] = budget
        model.forward = torch.compile(model.forward, backend=named or backend, options=options,
                                      dynamic=True if dynamic else None)  # fmt: skip
    ids = torch.randint(0, 1000, (1, prompt), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    generate(model, ids, 4, **kw)
    seconds = time.perf_counter() - start
    head_precision = print_weight_only(name) if name.startswith("ours-") else None
    return model, kw, seconds, head_precision


def print_weight_only(name: str) -> str | None:
    """Print how many linears a weight-only variant kept at 8 bits, the head's precision and
    the cosine to float; return the output head's precision (None: not weight-only)."""
    import embedl_dynamo

    head_precision = None
    for subgraph in embedl_dynamo.last_report().subgraphs:
        info = (subgraph.pipeline or {}).get("weight_only")
        if info:
            layers = subgraph.pipeline["layers"]
            head_precision = next(
                (r["precision"] for r in layers if "lm_head" in r["id"]), head_precision
            )
            print(
                f"{name}: {subgraph.runtime}, {info['bits']} bits, group {info['group_size']}, "
                f"{len(info['kept_int8'])} linears kept at 8 bits, head {head_precision}, "
                f"cosine {info['cosine']}"
            )
    return head_precision


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--prompt", type=int, default=PROMPT, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="embedl_onnxruntime")
    parser.add_argument("--json", help="also write the rows as JSON")
    parser.add_argument("--plot", help="write a PNG of ms per token beside each roofline")
    parser.add_argument("--accuracy-budget", type=float, default=None,
                        help="our accuracy_budget: random weights put int4 below the default "
                             "0.99 cosine, which then keeps every linear at 8 bits")  # fmt: skip
    parser.add_argument("--variants", nargs="+", default=[
        "eager", "inductor", "ours-fp32", "ours-fp32@embedl_openvino",
        "ours-bf16@embedl_openvino", "ours-int8_weight_only", "ours-int4_weight_only",
        "openvino-int8", "openvino-int4", "llama.cpp-q8_0", "llama.cpp-q4_0"])  # fmt: skip
    return parser.parse_args(argv)


def main() -> None:
    from bench.llm_peers import split_variants

    args = parse_args()
    torch.set_num_threads(2)
    try:
        ours, wanted = split_variants(args.variants)
    except ValueError as error:
        raise SystemExit(f"--variants: {error}") from None
    # every variant compiles the same transformers function, each 2-3 times (prefill, then
    # decode at static and at dynamic cache lengths): past Dynamo's 8 compiles of one function
    # the later variants would silently be timed in eager
    torch._dynamo.config.recompile_limit = 8 * len(ours)
    bandwidth = read_bandwidth_gbs()
    print(f"read bandwidth: {bandwidth:.1f} GB/s; layers {args.layers}; prompt {args.prompt}")
    ids = torch.randint(0, 1000, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as work_dir:
        peers = start_peers_on_our_model(wanted, args, work_dir) if wanted else []
        try:
            variants, meta = build_ours(ours, args)
            times = time_rounds(variants, peers, ids, [1, *args.new_tokens], args.rounds)
            compare_tokens(variants, peers, meta, ids)
        finally:
            for peer in peers:
                peer.close()
    for peer in peers:
        meta.update({name: {**info, "first_s": info["build_s"] + info["first_generate_s"]}
                     for name, info in peer.info.items()})  # fmt: skip
    names = [*variants, *(name for peer in peers for name in peer.info)]
    rows = report(names, times, meta, args, bandwidth)
    if args.json:
        peer_info = {name: meta[name] for name in names if name not in variants}
        result = {"bandwidth_gbs": bandwidth, "rows": rows, "peers": peer_info}
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        title = f"Qwen2.5-0.5B shape, {args.layers} layers, batch 1, 2 threads"
        plot(rows, args.new_tokens[-1], title, args.plot)


def start_peers_on_our_model(wanted, args, work_dir: str) -> list:
    """Save the model our variants build (same seed) and start each peer on it."""
    from bench.llm_peers import start_peers

    model_dir = str(Path(work_dir) / "model")
    model = qwen2_0_5b(args.layers)
    model.save_pretrained(model_dir)
    del model
    gc.collect()
    context = args.prompt + max(args.new_tokens) + 16
    return start_peers(wanted, model_dir, work_dir, 2, context)


def build_ours(names: list[str], args) -> tuple[dict, dict]:
    """name -> (model, generate kwargs), and name -> {first_s, weight_bytes}, for our variants
    (and eager, inductor)."""
    variants, meta = {}, {}
    for name in names:
        built = build_variant(name, args.layers, args.backend, args.accuracy_budget, args.prompt)
        if built is None:
            print(f"{name}: precision not registered; skipped")
            continue
        model, kw, first_s, head_precision = built
        precision = parse_ours(name)[0] if name.startswith("ours-") else "fp32"
        variants[name] = (model, kw)
        meta[name] = {"first_s": first_s,
                      "weight_bytes": decode_weight_bytes(model, precision, head_precision)}  # fmt: skip
        gc.collect()
    return variants, meta


def time_rounds(variants: dict, peers: list, ids, counts: list[int], rounds: int) -> dict:
    """(variant, new tokens) -> seconds of each round: our variants one by one and each peer's
    variants as one block, the order rotated each round. A peer that dies is reported and
    removed from ``peers``."""
    from bench.llm_peers import PeerDied

    times: dict = {}
    blocks = [*variants, *peers]
    prompt = ids[0].tolist()
    for round_index in range(rounds if blocks else 0):
        shift = round_index % len(blocks)
        for block in blocks[shift:] + blocks[:shift]:
            time.sleep(0.05)  # the last block's worker threads may still spin
            if block not in variants:
                try:
                    timed = block.time_round(round_index, prompt, counts)
                except PeerDied as error:
                    print(f"{block.spec.name} rows dropped: {error}")
                    peers.remove(block)
                    blocks.remove(block)
                    continue
                for key, seconds in timed.items():
                    times.setdefault(key, []).append(seconds)
                continue
            model, kw = variants[block]
            for tokens in counts:
                start = time.perf_counter()
                generate(model, ids, tokens, **kw)
                times.setdefault((block, tokens), []).append(time.perf_counter() - start)
    return times


def compare_tokens(variants: dict, peers: list, meta: dict, ids, tokens: int = 16) -> None:
    """Set ``meta[name]["same"]``: whether each float32 variant generates eager's tokens."""
    from bench.llm_peers import FLOAT_VARIANTS, PeerDied

    if "eager" not in variants:
        return
    reference = generate(variants["eager"][0], ids, tokens)
    for name, (model, kw) in variants.items():
        if not name.startswith("ours-") or parse_ours(name)[0] == "fp32":
            meta[name]["same"] = torch.equal(generate(model, ids, tokens, **kw), reference)
    expected = reference[0, ids.shape[1] :].tolist()
    for peer in [p for p in peers if FLOAT_VARIANTS & set(p.info)]:
        try:
            generated = peer.generate(ids[0].tolist(), tokens)
        except PeerDied as error:
            print(f"{peer.spec.name}: no tokens to compare ({error})")
            continue
        for name in FLOAT_VARIANTS & set(generated):
            peer.info[name]["same"] = generated[name] == expected


def report(names: list[str], times: dict, meta: dict, args, bandwidth: float) -> list[dict]:
    """Print the table; return its rows (``--json``, ``--plot``). ``meta``: each variant's
    first-output seconds, weight bytes per token and (float32 ones) tokens equal to eager's."""
    eager_ms, rows = None, []
    columns = " | ".join(f"ms/token ({n} new)" for n in args.new_tokens)
    print(f"| variant | {columns} | TTFT ms | first output s | weights/token GB | "
          "roofline ms | x roofline | tokens = eager |")  # fmt: skip
    print("|---" * (len(args.new_tokens) + 7) + "|")
    for name in names:
        ttft = statistics.median(times[(name, 1)])
        per_token = []
        for tokens in args.new_tokens:
            total = statistics.median(times[(name, tokens)])
            per_token.append((total - ttft) / (tokens - 1) * 1e3)
        weight_bytes = meta[name]["weight_bytes"]
        roofline = weight_bytes / (bandwidth * 1e9) * 1e3
        same = str(meta[name]["same"]) if "same" in meta[name] else "—"
        if name == "eager":
            eager_ms = per_token[-1]
        cells = " | ".join(f"{ms:.1f}" for ms in per_token)
        print(f"| {name} | {cells} | {ttft * 1e3:.0f} | {meta[name]['first_s']:.1f} | "
              f"{weight_bytes / 1e9:.3f} | {roofline:.2f} | {per_token[-1] / roofline:.2f} | "
              f"{same} |")  # fmt: skip
        rows.append({"variant": name, "ms_per_token": dict(zip(args.new_tokens, per_token)),
                     "ttft_ms": ttft * 1e3, "first_output_s": meta[name]["first_s"],
                     "weight_gb": weight_bytes / 1e9, "roofline_ms": roofline,
                     "x_roofline": per_token[-1] / roofline})  # fmt: skip
    if eager_ms:
        print(f"(eager {eager_ms:.1f} ms/token at {args.new_tokens[-1]} new tokens)")
    return rows


def plot(rows: list[dict], tokens: int, title: str, path: str) -> None:
    """Bars of ms per token at ``tokens`` new tokens, each with its roofline as a tick, colored
    by family (ours, OpenVINO, llama.cpp, PyTorch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.4 * len(rows) + 2, 3.6))
    xs = range(len(rows))
    families = {"ours-": "C0", "openvino-": "C1", "llama.cpp-": "C2"}
    colors = [next((c for p, c in families.items() if r["variant"].startswith(p)), "0.6")
              for r in rows]  # fmt: skip
    ax.bar(xs, [r["ms_per_token"][tokens] for r in rows], 0.6, color=colors,
           label="ms per token (blue: ours, orange: OpenVINO, green: llama.cpp)")  # fmt: skip
    ax.scatter(xs, [r["roofline_ms"] for r in rows], marker="_", s=900, color="black",
               label="roofline (weight bytes / read bandwidth)")  # fmt: skip
    ax.set_xticks(list(xs), [r["variant"].removeprefix("ours-") for r in rows], fontsize=8)
    ax.set_ylabel(f"ms per token ({tokens} new)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
