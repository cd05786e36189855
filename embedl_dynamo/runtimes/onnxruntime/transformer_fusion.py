"""ONNX Runtime's fused transformer kernels, as an opt-in step of the ``onnxruntime`` runtime.

ONNX Runtime ships fused CPU/GPU kernels for transformer blocks (``com.microsoft``
MultiHeadAttention, SkipLayerNormalization, BiasGelu, FastGelu, EmbedLayerNormalization). With
``transformer_fusion=True`` a float ONNX artifact with attention (a Softmax fed by a MatMul)
goes through two steps once, and the fused file is cached beside the artifact (keyed by the
artifact's key and the onnxruntime version):

1. our fused attentions become MultiHeadAttention nodes (:mod:`.ort_attention`; ONNX Runtime's
   optimizer does not recognise our export form, only HF's own);
2. ONNX Runtime's own transformer optimizer (``onnxruntime.transformers.optimizer``) fuses
   SkipLayerNormalization and BiasGelu: a well-kept library beats hand-written rewrites.

The fused-op counts are recorded in the runtime's ``build_info`` (``ort_fusions``). Our plan
stays the record of what *we* fused; these counts say which kernels run it. Q/DQ graphs are
left alone (the fusions are float patterns). A fused file whose outputs disagree with the graph
is not used (see the runtime).

Measured on HF BERT-base (seq 128, batch 1, this CPU, one process): MultiHeadAttention alone
1% faster than the decomposed attention; ONNX Runtime's SkipLayerNormalization and BiasGelu
fusions 3% slower (0.802x eager against 0.778x), at 9 s more compile time. So it is opt-in.
Opting in runs both steps: ONNX Runtime's fused kernels are what its GPU providers are built
around, and the fused-op counts are how a user sees what ONNX Runtime made of the graph.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import onnx

from embedl_dynamo.cache.keys import content_key
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.runtimes.onnxruntime.ort_attention import fuse_attention

__all__ = ["FUSED_OPS", "fused_artifact", "has_attention"]

logger = logging.getLogger(__name__)

FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "EmbedLayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "LayerNormalization",
)


def has_attention(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is a float graph with attention: a Softmax fed by a MatMul, no Q/DQ."""
    nodes = model.graph.node
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in nodes):
        return False
    producer = {out: n for n in nodes for out in n.output}

    def fed_by_matmul(name: str, depth: int = 4) -> bool:
        node = producer.get(name)
        if node is None:
            return False
        if node.op_type in ("MatMul", "Gemm"):
            return True
        return depth > 0 and any(fed_by_matmul(i, depth - 1) for i in node.input if i)

    return any(n.op_type == "Softmax" and fed_by_matmul(n.input[0]) for n in nodes)


def _fuse(source: Path, target: Path, heads: Callable[[], Mapping[str, int]]) -> dict[str, int]:
    from onnxruntime.transformers.optimizer import optimize_model

    # opt_level 0: only the optimizer's Python fusions; ONNX Runtime's own graph optimisations
    # run when the session loads the file, as for every artifact. The optimizer warns and
    # prints about every pattern it does not find: quiet by default (our logs say the outcome)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            optimized = optimize_model(str(source), model_type="bert", num_heads=0,
                                       hidden_size=0, opt_level=0)  # fmt: skip
    finally:
        logging.disable(previous)
    counts = {op: int(n) for op, n in optimized.get_fused_operator_statistics().items() if n}
    # then ours: the plan's fused attentions, one kernel each (after the optimizer, whose
    # graph sort does not take a node's empty optional inputs)
    attention = fuse_attention(optimized.model, heads())
    if attention:
        counts["MultiHeadAttention"] = attention
    optimized.save_model_to_file(str(target), use_external_data_format=False)
    return counts


def fused_artifact(
    path: Path, key: str, cache_dir: Any, heads: Callable[[], Mapping[str, int]]
) -> tuple[Path, dict[str, int]] | None:
    """The artifact at ``path`` with ONNX Runtime's transformer fusions, from the cache if built.

    ``heads`` gives each fused attention module's name and number of heads; it is called only
    when the fused file is built (it may run the graph).

    Returns:
        ``(fused path, {fused op: count})``, or None when the graph has no attention or the
        optimizer fused nothing (the plain artifact is used then).
    """
    model = onnx.load(str(path), load_external_data=False)
    if not has_attention(model):
        return None
    import onnxruntime

    cache = ArtifactCache(cache_dir, "onnx_fused")
    fused_key = content_key("ort_transformer_fusion", key, onnxruntime.__version__)
    counts: dict[str, int] = {}

    def build(target: Path) -> None:
        counts.update(_fuse(path, target, heads))

    try:
        fused, built = cache.get_or_build(fused_key, build, ".onnx", meta={"kind": "fused"})
    except Exception as exc:  # the optimizer raises many types on graphs it does not expect
        logger.info("ONNX Runtime's transformer optimizer did not apply (%s)", exc)
        return None
    if not built:
        fused_model = onnx.load(str(fused), load_external_data=False)
        for node in fused_model.graph.node:
            if node.op_type in FUSED_OPS:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
    if not any(counts.get(op) for op in FUSED_OPS if op != "LayerNormalization"):
        return None
    logger.info("ONNX Runtime fused: %s", ", ".join(f"{k} x{v}" for k, v in counts.items()))
    return fused, counts
