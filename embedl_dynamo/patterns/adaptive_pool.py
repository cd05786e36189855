"""``adaptive_pool_matrix``: adaptive average pooling to a size that does not divide the input,
as two constant matrix products, so it exports to ONNX.

ONNX has no adaptive pooling; exporters map it to ``AveragePool`` only when each input size is
a multiple of the output size (VGG's 7x7 pool from a 4x4 map at 128x128 input is not). PyTorch's
window for output ``i`` of ``n -> m`` is ``[floor(i*n/m), ceil((i+1)*n/m))``, so with

    P_h[i, j] = 1/|window_i| if j in window_i else 0          (m_h x n_h, likewise P_w)

``adaptive_avg_pool2d(x, (m_h, m_w)) == P_h @ x @ P_w^T`` over the last two axes, exactly in
real arithmetic (float rounding only: the sums are reordered).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph.meta import infer_meta
from embedl_dynamo.graph.nodes import copy_meta
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = ["ADAPTIVE_POOL_PATTERNS", "AdaptivePoolMatrix", "pooling_matrix"]


def pooling_matrix(size_in: int, size_out: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``size_out x size_in`` matrix of PyTorch's adaptive average windows."""
    matrix = torch.zeros(size_out, size_in, dtype=torch.float64)
    for i in range(size_out):
        start = (i * size_in) // size_out
        end = math.ceil((i + 1) * size_in / size_out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix.to(dtype)


def _pair(size: object) -> tuple[object, object]:
    return tuple(size) if isinstance(size, (tuple, list)) else (size, size)  # type: ignore[return-value]


class AdaptivePoolMatrix(Pattern):
    """``adaptive_avg_pool2d(x, (m_h, m_w))`` with a non-dividing size becomes
    ``matmul(matmul(P_h, x), P_w^T)`` with constant pooling matrices."""

    name = "adaptive_pool_matrix"
    phase = "conversion"

    @staticmethod
    def target(x):
        pool = F.adaptive_avg_pool2d(x, 7)
        return pool, {"pool": pool}

    def check(self, m: Match) -> MatchResult:
        shape = m.shape("x")
        if shape is None or len(shape) < 3:
            return m.fail("pooling input shape is unknown (trace with example inputs)")
        try:
            size_in = (int(shape[-2]), int(shape[-1]))
        except TypeError:
            return m.fail("pooling input height or width is symbolic")
        size_out = _pair(m.kwarg("pool", "output_size"))
        if any(not isinstance(s, int) for s in size_out):
            return m.fail(f"output size {size_out} is not fixed")
        if all(n % o == 0 for n, o in zip(size_in, size_out)):
            return m.fail("the output size divides the input: exporters take it as AveragePool")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        shape = m.shape("x")
        (n_h, n_w), (o_h, o_w) = (
            (int(shape[-2]), int(shape[-1])),
            _pair(m.kwarg("pool", "output_size")),
        )
        dtype = m.anchor.meta["val"].dtype if "val" in m.anchor.meta else torch.float32
        rows = m.constant(pooling_matrix(n_h, o_h, dtype), "pool_rows")
        cols = m.constant(pooling_matrix(n_w, o_w, dtype).t().contiguous(), "pool_cols")
        height = m.call(torch.matmul, input=rows, other=m["x"])
        out = m.call(torch.matmul, input=height, other=cols)
        infer_meta(m.gm, [height])
        copy_meta(m.anchor, out)
        return out


ADAPTIVE_POOL_PATTERNS = (AdaptivePoolMatrix(),)
