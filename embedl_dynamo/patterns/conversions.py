"""Structural conversions of the ``tensorrt`` target: exact rewrites run to a fixpoint.

* ``flatten_linear``: ``linear(flatten(x, 1), W, b)`` with ``x`` of shape ``(N, C, 1, 1)`` is
  ``flatten(conv2d(x, W[:, :, None, None], b), 1)``: both compute
  ``y[n, o] = sum_c W[o, c] x[n, c, 0, 0] + b[o]``. The classifier then runs as a 1x1
  convolution, which TensorRT fuses and quantizes like the rest of the network.
* ``addmm_linear``: ``addmm(b, x, W)`` with constant ``W`` ``(in, out)`` is ``linear(x, W.T, b)``
  (HF's ``Conv1D``, as in GPT-2), so it fuses and quantizes like any linear.
* ``remove_dropout``: ``dropout(x, training=False)`` is ``x``.
* ``remove_identity``: ``identity(x)`` (``nn.Identity``) is ``x``; ``x.contiguous()`` is not an
  identity (a later ``view`` may need its layout) and stays.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from torch import fx

from embedl_dynamo.graph.canonical_ops import identity
from embedl_dynamo.graph.meta import infer_meta
from embedl_dynamo.graph.nodes import copy_meta
from embedl_dynamo.rewrite.match import Match, MatchResult
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = ["CONVERSION_PATTERNS", "AddmmLinear", "FlattenLinear", "RemoveDropout", "RemoveIdentity"]

torch.fx.wrap("identity")  # a leaf in pattern targets, as in canonical graphs


class FlattenLinear(Pattern):
    """``Flatten -> Linear`` on an ``(N, C, 1, 1)`` input becomes ``Conv2d(1x1) -> Flatten``.

    ``W`` of shape ``(O, C)`` becomes the conv weight ``W[:, :, None, None]``; the bias is kept.
    """

    name = "flatten_linear"
    phase = "conversion"
    id_node = "linear"

    @staticmethod
    def target(x, w, b):
        flat = torch.flatten(x, 1)
        linear = F.linear(flat, w, b)
        return linear, {"flatten": flat, "linear": linear}

    def check(self, m: Match) -> MatchResult:
        shape = m.shape("x")
        if shape is None:
            return m.fail("flatten input shape is unknown (trace with example inputs)")
        if len(shape) != 4 or tuple(shape[2:]) != (1, 1):
            return m.fail(f"flatten input is not N,C,1,1 (shape {tuple(shape)})")
        start, end = m.kwarg("flatten", "start_dim"), m.kwarg("flatten", "end_dim")
        if start != 1 or end not in (-1, 3):
            return m.fail(f"flatten does not merge dims 1..3 (start_dim={start}, end_dim={end})")
        if not m.all_constant("w", "b"):
            return m.fail("linear weight is not a constant")
        weight = m.value("w")
        if weight is None or weight.dim() != 2 or weight.shape[1] != shape[1]:
            return m.fail("linear weight does not match the flattened channels")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        weight = m.value("w")
        conv_weight = m.constant(weight.reshape(*weight.shape, 1, 1), "weight")
        conv = m.call(torch.conv2d, input=m["x"], weight=conv_weight, bias=m["b"])
        out = m.call(torch.flatten, input=conv, start_dim=1, end_dim=-1)
        infer_meta(m.gm, [conv])
        copy_meta(m.anchor, out)
        return out


class AddmmLinear(Pattern):
    """``addmm(b, x, W)`` with a constant ``W`` of shape ``(in, out)`` becomes
    ``linear(x, W.T, b)``: both compute ``x @ W + b``.

    GPT-2's ``Conv1D`` layers (and other HF layers) are written as ``addmm``; as linears they are
    fused, cast to half and quantized like every other fully connected layer.
    """

    name = "addmm_linear"
    phase = "conversion"
    id_node = "addmm"

    @staticmethod
    def target(b, x, w):
        out = torch.addmm(b, x, w)
        return out, {"addmm": out}

    def check(self, m: Match) -> MatchResult:
        if m.kwarg("addmm", "beta") != 1 or m.kwarg("addmm", "alpha") != 1:
            return m.fail("addmm with beta or alpha != 1")
        if not m.all_constant("w", "b"):
            return m.fail("addmm weight or bias is not a constant")
        weight, bias = m.value("w"), m.value("b")
        if weight.dim() != 2 or bias.dim() != 1 or bias.shape[0] != weight.shape[1]:
            return m.fail("addmm bias is not one value per output feature")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        weight = m.constant(m.value("w").t().contiguous(), "weight")
        out = m.call(F.linear, input=m["x"], weight=weight, bias=m["b"])
        copy_meta(m.anchor, out)
        return out


class RemoveDropout(Pattern):
    """Eval-mode dropout (``training=False``) is the identity: replaced by its input."""

    name = "remove_dropout"
    phase = "conversion"

    @staticmethod
    def target(x):
        out = F.dropout(x)
        return out, {"dropout": out}

    def check(self, m: Match) -> MatchResult:
        if m.kwarg("dropout", "training"):
            return m.fail("dropout is in training mode (call model.eval())")
        return m.ok()

    def replace(self, m: Match) -> fx.Node:
        return m["x"]


class RemoveIdentity(Pattern):
    """``identity(x)`` (``nn.Identity``) is replaced by ``x``."""

    name = "remove_identity"
    phase = "conversion"

    @staticmethod
    def target(x):
        out = identity(x)
        return out, {"identity": out}

    def replace(self, m: Match) -> fx.Node:
        return m["x"]


CONVERSION_PATTERNS = (FlattenLinear(), AddmmLinear(), RemoveDropout(), RemoveIdentity())
