"""Cheap ways to settle ``runtime="auto"`` without timing every runtime: the architecture key
and the family rule.

* :func:`architecture_key`: what a measured runtime decision depends on. The speed of a graph on
  a runtime follows from its structure (ops, literal arguments, module attributes, the dtype and
  shape of every constant and input), not from the values of its weights, so a model trained
  again, or fine-tuned, takes the decision measured for the same architecture on the same CPU
  with the same library versions and threads (:mod:`.runtime_choice` adds those to the key).
* :func:`family_rule`: a rule by op mix and size, learned from measurements. A large
  transformer-style graph (attention: matmuls and a softmax, no convolution, and at least
  :data:`TRANSFORMER_MIN_FLOPS` of matmul work per call, counted by PyTorch's FLOP counter on
  fake tensors of the sample's shapes) runs float fastest on OpenVINO of the CPU runtimes: every such model measured on the
  CPUs of this project, on both OpenVINO and ONNX Runtime, put OpenVINO ahead by more than the
  timer's clear-lead factor (:data:`~embedl_dynamo.tuning.timer.CLEAR`), while small
  transformers went to ONNX Runtime (its per-call cost is lower), hence the size gate. So
  OpenVINO is tried first and, where it builds and passes the judge, the contest stops there:
  the others are not built or timed. Any other graph, a lower-precision option (``mixed``: its
  speed depends on the layers it quantized) or a leader that fails to build is decided by
  measuring, as before.
* :func:`precision_rule`: a precision whose kernels one runtime leads. The weight-only
  precisions are a decoder's weights streamed once per token, so the per-token time is the
  weight-only matmul kernels': ONNX Runtime's ``MatMulNBits`` (int8 compute on int4/int8
  blocks) led OpenVINO's compressed-weight matmuls on our artifact at both bit widths on the
  decoders measured (``python -m bench run llm_decode``), so under ``auto`` ONNX Runtime builds those graphs
  when it is installed. The rule orders the runtimes; nothing is built twice.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from embedl_dynamo.cache.keys import content_key, module_attributes
from embedl_dynamo.graph.printer import format_graph

__all__ = [
    "FAMILY_RULES",
    "PRECISION_RULES",
    "TRANSFORMER_MIN_FLOPS",
    "FamilyRule",
    "PrecisionRule",
    "architecture_key",
    "family_rule",
    "graph_family",
    "matmul_flops",
    "precision_rule",
]


#: matmul work per call (FLOPs, a multiply-add counting two) from which the transformer rule
#: applies: BERT-base at sequence 128 is above it, the small encoders ONNX Runtime won are below
TRANSFORMER_MIN_FLOPS = 10e9


@dataclass(frozen=True)
class FamilyRule:
    """A runtime that leads a graph family clearly enough to stop the contest at it.

    Attributes:
        family: the family (:func:`graph_family`).
        leader: the runtime name tried first; the contest stops where it builds.
        min_flops: the least work per call (:func:`matmul_flops`) the rule applies from.
        evidence: what measurements back the rule (shown in the report's note).
    """

    family: str
    leader: str
    min_flops: float
    evidence: str


FAMILY_RULES: tuple[FamilyRule, ...] = (
    FamilyRule(
        "transformer",
        "openvino",
        TRANSFORMER_MIN_FLOPS,
        "OpenVINO led every large transformer measured",
    ),
)


@dataclass(frozen=True)
class PrecisionRule:
    """A runtime whose kernels for some precisions lead, so ``auto`` builds it first.

    Attributes:
        precisions: the precision names the rule applies to.
        leader: the runtime name ``auto`` puts first (where it is installed).
        evidence: what measurements back the rule (shown in the report's note).
    """

    precisions: frozenset[str]
    leader: str
    evidence: str


PRECISION_RULES: tuple[PrecisionRule, ...] = (
    PrecisionRule(
        frozenset({"int8_weight_only", "int4_weight_only"}),
        "onnxruntime",
        "ONNX Runtime's MatMulNBits led OpenVINO's compressed-weight matmuls per "
        "token on every decoder measured",
    ),
)

logger = logging.getLogger(__name__)

_CONV = re.compile(r"conv(?!ert)")  # convolutions, not convert_element_type
_ATTENTION = ("softmax", "scaled_dot_product_attention", "attention")
_MATMUL = ("linear", "matmul", "addmm", "bmm", "mm", "einsum", "attention")


def _op_names(gm: fx.GraphModule) -> list[str]:
    """The lowercase op name of every call in ``gm`` (a module call by its class name)."""
    names = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            names.append(type(gm.get_submodule(str(node.target))).__name__.lower())
        elif node.op in ("call_function", "call_method"):
            names.append(str(getattr(node.target, "__name__", node.target)).lower())
    return names


def graph_family(gm: fx.GraphModule) -> str | None:
    """``transformer`` for a graph with attention (a softmax or an attention op) and matmuls but
    no convolution; None for any other graph (no rule applies)."""
    names = _op_names(gm)
    if any(_CONV.search(n) for n in names):
        return None
    attention = any(a in n for n in names for a in _ATTENTION)
    matmul = any(m in n for n in names for m in _MATMUL)
    return "transformer" if attention and matmul else None


def matmul_flops(gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> int:
    """FLOPs of one call of ``gm`` on ``inputs`` (matmuls, convolutions, attention), as
    PyTorch's :class:`~torch.utils.flop_counter.FlopCounterMode` counts them, on fake tensors
    (shapes only: nothing is computed); 0 where the graph does not run on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
            with FlopCounterMode(display=False) as counter:
                gm(*inputs)
    except Exception as exc:  # no count, no rule: the contest decides
        logger.debug("FLOPs not counted on fake tensors: %s", exc)
        return 0
    return int(counter.get_total_flops())


def family_rule(
    gm: fx.GraphModule, inputs: Sequence[torch.Tensor], runtimes: Sequence[str]
) -> FamilyRule | None:
    """The rule that settles the float graph ``gm`` among ``runtimes`` (names), or None (its
    FLOPs are counted on ``inputs``' shapes only where a rule of its family exists)."""
    family = graph_family(gm)
    rules = [r for r in FAMILY_RULES if r.family == family and r.leader in runtimes]
    if not rules:
        return None
    flops = matmul_flops(gm, inputs)
    return next((r for r in rules if flops >= r.min_flops), None)


def precision_rule(precision: str, runtimes: Sequence[str]) -> PrecisionRule | None:
    """The rule that puts one of ``runtimes`` (names, best first) ahead for ``precision``
    (a name), or None (no rule, or its leader is not among them, or already first)."""
    return next(
        (r for r in PRECISION_RULES if precision in r.precisions and r.leader in runtimes[1:]),
        None,
    )


def _constant(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _header(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}|{tuple(value.shape)}"
    return repr(value)


def architecture_key(gm: fx.GraphModule, inputs: Sequence[torch.Tensor], *parts: Any) -> str:
    """A key of ``gm``'s architecture: its printed structure with literal arguments, the
    attributes of every called module, the name, dtype and shape (not the values) of every
    constant, and the dtype and shape of every input; ``parts`` are added as they are.

    Returns:
        64 lowercase hex characters.
    """
    modules = [
        f"{node.target}.{name}:{module_attributes(m)}"
        for node in gm.graph.nodes
        if node.op == "call_module"
        for name, m in gm.get_submodule(str(node.target)).named_modules()
    ]
    constants = [f"{n}|{_header(t)}" for n, t in [*gm.named_parameters(), *gm.named_buffers()]]
    constants += [
        f"{node.target}|{_header(_constant(gm, str(node.target)))}"
        for node in gm.graph.nodes
        if node.op == "get_attr"
    ]
    shapes = [_header(t) for t in inputs]
    return content_key(
        "architecture",
        format_graph(gm, literals=True),
        modules,
        sorted(set(constants)),
        shapes,
        *parts,
    )
