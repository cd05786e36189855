"""The public rewrite API: :func:`transform`, :func:`get_transformation_plan`, :func:`apply_transformation_plan`.

They run the :mod:`~embedl_dynamo.rewrite.engine` with the given patterns, or with the active
Backend's conversions and fusions (:func:`~embedl_dynamo.backend.get_backend`) when none are given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from embedl_dynamo.backend import get_backend
from embedl_dynamo.rewrite.engine import (
    TransformResult,
    apply_transformation_plan,
    plan_transformation,
    trace,
)
from embedl_dynamo.rewrite.pattern import Pattern
from embedl_dynamo.rewrite.plan import TransformationPlan

__all__ = [
    "TransformResult",
    "apply_transformation_plan",
    "get_transformation_plan",
    "trace",
    "transform",
]


def get_transformation_plan(
    graph_module: nn.Module,
    patterns: Sequence[Pattern] | None = None,
    args: Sequence[Any] | None = None,
) -> TransformationPlan:
    """Canonicalise a deep copy, apply the conversions and plan the fusions.

    Args:
        graph_module: an ``fx.GraphModule`` (or ``nn.Module``, traced first); not modified.
        patterns: the patterns to use; the active Backend's conversions and fusions if None.
        args: example inputs for shape-dependent rewrites (optional).

    Returns:
        The plan; ``plan.model`` is the converted copy that the fusion entries refer to.

    Example:
        ```python
        plan = embedl_dynamo.get_transformation_plan(model.eval(), (x,))
        plan.disable("conv_bn@*layer4*")  # by glob
        result = embedl_dynamo.apply_transformation_plan(plan)
        ```
    """
    if patterns is None:
        backend = get_backend()
        patterns = [*backend.conversion_patterns, *backend.fusion_patterns]
    return plan_transformation(graph_module, patterns, args)


def transform(
    model: nn.Module,
    args: Sequence[Any] | None = None,
    patterns: Sequence[Pattern] | None = None,
) -> TransformResult:
    """Run conversions and fusions on ``model`` and return the transformed copy.

    Args:
        model: ``nn.Module`` (traced with ``torch.fx``) or ``fx.GraphModule``; not modified.
        args: example inputs (optional; enables shape-dependent rewrites).
        patterns: pattern list; the active Backend's conversions and fusions when omitted.

    Returns:
        ``result.model`` (GraphModule), ``result.report`` (``applied_count``,
        ``skipped_count``, per-pattern counts, matches) and ``result.plan``.

    Example:
        ```python
        result = embedl_dynamo.transform(model.eval(), (x,))  # the active Backend's patterns
        print(result.plan)  # each match, applied or not, and why
        y = result.model(x)
        ```
    """
    plan = get_transformation_plan(model, patterns, args)
    return apply_transformation_plan(plan)
