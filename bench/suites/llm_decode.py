"""Decoder LLM generation: ms per token, time to first token, first output, roofline.

A Qwen2.5-0.5B-shaped decoder (:func:`bench.models.decoder.qwen2_0_5b`: 24 layers, hidden
896, grouped-query attention 14/2, vocabulary 151,936, tied embeddings; ``--layers``), batch
1, a ``--prompt``-token prompt, greedy, timed by the one timer in rotating rounds (each
variant's token counts one block):

* ``eager``: transformers as it is (dynamic cache); ``inductor``: ``torch.compile(model
  .forward)`` with the static cache;
* ``ours-<precision>[@<target>][+dynamic]``: ``model.forward = torch.compile(model.forward,
  backend=...)`` (:func:`bench.variants.ours.parse`; ``--backend`` where no target is named;
  ``+dynamic`` passes ``dynamic=True``), skipped where the registry lacks the precision;
* the peers in their own venvs (:mod:`bench.variants.llm_peers`: ``llama.cpp-<f32|q8_0|q4_0>``
  and ``openvino-<fp32|default|int8|int4|int8-f32|int4-f32>``), each one process on the same
  model saved with ``save_pretrained``, timing itself one block per round; their rows name
  the tool.

Per token = (time of N new tokens - time of 1) / (N - 1); time to first token = the time of
one new token. First output = seconds until the first generated tokens (ours: the first
``generate()``, compile included; a peer: conversion, load and first generation). The
roofline is the bytes a decode step reads over the read bandwidth measured here
(:func:`bench.harness.bandwidth.read_bandwidth_gbs`): ours, every linear weight and the output
head at the variant's bytes per weight; a peer, what it reports. Random weights are no test
of accuracy: their int4 cosine falls below the default budget, so int4 rows need a lower
``--accuracy-budget`` to measure int4 (``tests/dynamo/test_perplexity.py`` has the accuracy).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path

import torch

from bench.harness.bandwidth import read_bandwidth_gbs
from bench.harness.record import Record
from bench.harness.table import number
from bench.harness.timer import interleaved, timed_call
from bench.models.decoder import generate, prompt, qwen2_0_5b
from bench.variants.ours import parse

__all__ = ["BASELINE", "arguments", "decode_weight_bytes", "plot", "run", "smoke", "table"]

BASELINE = "eager"
BYTES_PER_WEIGHT = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "int8_weight_only": 1.0,
    "int4_weight_only": 0.5,
}
VARIANTS = (
    "eager",
    "inductor",
    "ours-fp32",
    "ours-fp32@openvino",
    "ours-bf16@openvino",
    "ours-int8_weight_only",
    "ours-int4_weight_only",
    "openvino-int8",
    "openvino-int4",
    "llama.cpp-q8_0",
    "llama.cpp-q4_0",
)


def arguments(parser: argparse.ArgumentParser) -> None:
    """The suite's options."""
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="embedl_onnxruntime")
    parser.add_argument("--accuracy-budget", type=float, help="ours' accuracy_budget")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))


def smoke(args: argparse.Namespace) -> None:
    """Two layers, 4 and 8 new tokens, one round, eager against ours in fp32."""
    args.layers, args.new_tokens, args.rounds = 2, [4, 8], 1
    args.variants = ["eager", "ours-fp32"]


def decode_weight_bytes(model, precision: str, head_precision: str | None = None) -> float:
    """Weights a decode step reads: every linear weight and the output head once, the head at
    ``head_precision`` where the report says it differs (int4 keeps it at 8 bits unless the
    accuracy budget allows 4)."""
    per_weight = BYTES_PER_WEIGHT.get(precision, 4.0)
    head = model.get_output_embeddings().weight.numel()
    count = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head_bytes = head * BYTES_PER_WEIGHT.get(head_precision or precision, per_weight)
    return (count - head) * per_weight + head_bytes


def _weight_only(name: str) -> str | None:
    """Print what a weight-only variant kept at 8 bits; return the output head's precision."""
    import embedl_dynamo

    head = None
    for subgraph in embedl_dynamo.last_report().subgraphs:
        info = (subgraph.pipeline or {}).get("weight_only")
        if info:
            layers = subgraph.pipeline["layers"]
            head = next((r["precision"] for r in layers if "lm_head" in r["id"]), head)
            print(
                f"{name}: {subgraph.runtime}, {info['bits']} bits, group {info['group_size']}, "
                f"{len(info['kept_int8'])} linears kept at 8 bits, head {head}, cosine "
                f"{info['cosine']}"
            )
    return head


def _build(name: str, args: argparse.Namespace):
    """(model, generate kwargs, meta) of one of ours (or eager, inductor); None: skipped."""
    from embedl_dynamo.precision import precision_names

    model, kw, precision = qwen2_0_5b(args.layers), {}, "fp32"
    if name == "inductor":
        model.forward = torch.compile(model.forward)
        kw = {"cache_implementation": "static"}
    elif name.startswith("ours-"):
        precision, backend, dynamic = parse(name)
        if precision not in precision_names():
            return None
        options = {"precision": precision}
        if args.accuracy_budget is not None:
            options["accuracy_budget"] = args.accuracy_budget
        model.forward = torch.compile(
            model.forward,
            backend=backend or args.backend,
            options=options,
            dynamic=True if dynamic else None,
        )
    _, first = timed_call(generate, model, prompt(args.prompt), 4, **kw)
    head = _weight_only(name) if name.startswith("ours-") else None
    meta = {"first_output": first, "weight_bytes": decode_weight_bytes(model, precision, head)}
    return model, kw, meta


def _start_peers(wanted, args, work_dir: str) -> list:
    """Save the model our variants build (same seed) and start each peer on it."""
    from bench.variants.llm_peers import start_peers

    model_dir = str(Path(work_dir) / "model")
    qwen2_0_5b(args.layers).save_pretrained(model_dir)
    gc.collect()
    context = args.prompt + max(args.new_tokens) + 16
    return start_peers(wanted, model_dir, work_dir, args.threads, context)


def _peer_round(peer, peers: list, ids: list[int], counts: list[int]):
    """The external block of one peer: a round in its process, or None once it died."""
    from bench.variants.llm_peers import PeerDied

    def one(index: int):
        try:
            return peer.time_round(index, ids, counts)
        except PeerDied as error:
            print(f"{peer.spec.name} rows dropped: {error}")
            peers.remove(peer)
            return None

    return one


def _same_tokens(built: dict, peers: list, meta: dict, ids, tokens: int = 16) -> None:
    """Set ``meta[name]["same"]``: whether each float32 variant generates eager's tokens."""
    from bench.variants.llm_peers import FLOAT_VARIANTS, PeerDied

    if "eager" not in built:
        return
    reference = generate(built["eager"][0], ids, tokens)
    for name, (model, kw) in built.items():
        if not name.startswith("ours-") or parse(name)[0] == "fp32":
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


def _rows(record: Record, timings, meta: dict, args, bandwidth: float) -> None:
    base = {"layers": args.layers, "prompt": args.prompt}
    for name, info in meta.items():
        if (name, 1) not in timings.rounds:
            continue
        ttft = timings.median((name, 1))
        tool = info.get("tool")
        record.add("qwen2_0_5b", name, "ttft", ttft * 1e3, "ms", params=base, tool=tool)
        for tokens in args.new_tokens:
            per = (timings.median((name, tokens)) - ttft) / (tokens - 1) * 1e3
            params = {**base, "new_tokens": tokens}
            record.add("qwen2_0_5b", name, "per_token", per, "ms/token", params=params, tool=tool)
        roofline = info["weight_bytes"] / (bandwidth * 1e9) * 1e3
        record.add("qwen2_0_5b", name, "first_output", info["first_output"], "s", params=base)
        record.add("qwen2_0_5b", name, "weights", info["weight_bytes"] / 1e9, "GB", params=base)
        record.add("qwen2_0_5b", name, "roofline", roofline, "ms bound", params=base)
        record.add("qwen2_0_5b", name, "x_roofline", per / roofline, "x", params=base)
        if "same" in info:
            record.add("qwen2_0_5b", name, "same_tokens", info["same"], "bool", params=base)


def run(args: argparse.Namespace, record: Record) -> None:
    """Build ours and start the peers, time them in rotating rounds, add the rows."""
    from bench.variants.llm_peers import split_variants

    try:
        ours, wanted = split_variants(args.variants)
    except ValueError as error:
        raise SystemExit(f"--variants: {error}") from None
    # each variant compiles the same transformers function 2-3 times: past Dynamo's 8 compiles
    # of one function the later variants would silently be timed in eager
    torch._dynamo.config.recompile_limit = 8 * max(len(ours), 1)
    bandwidth = read_bandwidth_gbs()
    record.extra["bandwidth_gbs"] = bandwidth
    print(f"read bandwidth: {bandwidth:.1f} GB/s; layers {args.layers}; prompt {args.prompt}")
    ids, counts = prompt(args.prompt), [1, *args.new_tokens]
    built, meta = {}, {}
    with tempfile.TemporaryDirectory() as work_dir:
        peers = _start_peers(wanted, args, work_dir) if wanted else []
        try:
            for name in ours:
                made = _build(name, args)
                if made is None:
                    print(f"{name}: precision not registered; skipped")
                    continue
                built[name], meta[name] = made[:2], made[2]
                gc.collect()
            calls = {
                (n, c): (lambda m=m, kw=kw, c=c: generate(m, ids, c, **kw))
                for n, (m, kw) in built.items()
                for c in counts
            }
            external = {p.spec.name: _peer_round(p, peers, ids[0].tolist(), counts) for p in peers}
            timings = interleaved(
                calls, args.rounds, warmup=0, repeat=1, group=lambda key: key[0], external=external
            )
            _same_tokens(built, peers, meta, ids)
        finally:
            for peer in peers:
                peer.close()
    for peer in peers:
        for name, info in peer.info.items():
            meta[name] = {**info, "first_output": info["build_s"] + info["first_generate_s"]}
    record.extra["peers"] = {n: i for p in peers for n, i in p.info.items()}
    _rows(record, timings, meta, args, bandwidth)


def table(record: Record, view: str = "main") -> str:
    """A line per variant: ms per token per count, TTFT, first output, roofline, the tool."""
    counts = sorted({r["params"]["new_tokens"] for r in record.find(metric="per_token")})
    head = [
        "variant",
        *(f"ms/token ({n} new)" for n in counts),
        "TTFT ms",
        "first output s",
        "weights/token GB",
        "roofline ms",
        "x roofline",
        "tokens = eager",
        "tool",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant in dict.fromkeys(r["variant"] for r in record.find(metric="ttft")):
        rows = {
            (r["metric"], r["params"].get("new_tokens")): r for r in record.find(variant=variant)
        }
        cells = [
            number(rows[("per_token", n)]["value"]) if ("per_token", n) in rows else "-"
            for n in counts
        ]
        for metric in ("ttft", "first_output", "weights", "roofline", "x_roofline"):
            cells.append(number(rows[(metric, None)]["value"]) if (metric, None) in rows else "-")
        same = rows.get(("same_tokens", None))
        cells.append("-" if same is None else str(bool(same["value"])))
        cells.append(
            rows[("ttft", None)].get("tool", "ours" if variant.startswith("ours") else "-")
        )
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(record: Record, path) -> None:
    """Bars of ms per token at the last count, each with its roofline as a tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.harness.plot import title

    tokens = max(r["params"]["new_tokens"] for r in record.find(metric="per_token"))
    rows = [r for r in record.find(metric="per_token") if r["params"]["new_tokens"] == tokens]
    roof = {r["variant"]: r["value"] for r in record.find(metric="roofline")}
    fig, ax = plt.subplots(figsize=(1.4 * len(rows) + 2, 3.6))
    xs = range(len(rows))
    families = {"ours-": "C0", "openvino-": "C1", "llama.cpp-": "C2"}
    colors = [
        next((c for p, c in families.items() if r["variant"].startswith(p)), "0.6") for r in rows
    ]
    ax.bar(
        xs,
        [r["value"] for r in rows],
        0.6,
        color=colors,
        label="ms per token (blue: ours, orange: OpenVINO, green: llama.cpp)",
    )
    ax.scatter(
        xs,
        [roof.get(r["variant"], 0.0) for r in rows],
        marker="_",
        s=900,
        color="black",
        label="roofline (weight bytes / read bandwidth)",
    )
    ax.set_xticks(list(xs), [r["variant"].removeprefix("ours-") for r in rows], fontsize=8)
    ax.set_ylabel(f"ms per token ({tokens} new)")
    ax.set_title(title(record, "decoder LLM, batch 1"), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
