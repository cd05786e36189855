"""The transformation plan: every match found, whether it will be applied, and why not.

A :class:`TransformationPlan` is what users inspect and edit between planning and applying::

    plan = get_transformation_plan(gm, patterns)
    print(plan)                               # table: id, pattern, node, apply, reason
    plan.disable("conv_bn_relu@*layer4*")     # glob over stable ids
    result = apply_transformation_plan(plan)

Ids are ``<pattern>@<module path>`` (``conv_bn_relu@layer4.1.conv2``), stable across runs and
across torch releases because they come from the user's module names, not from FX node names.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from embedl_dynamo.report.plan_rows import PlanSnapshot, format_table
from embedl_dynamo.rewrite.pattern import Pattern

__all__ = ["PatternMatch", "TransformResult", "TransformationPlan", "OVERLAP_PREFIX"]

OVERLAP_PREFIX = "overlaps "


@dataclass
class PatternMatch:
    """One match of one pattern in the plan.

    Attributes:
        id: stable id ``<pattern>@<module path>``.
        pattern: the pattern that matched.
        node: name of the anchor node in ``plan.model``.
        nodes: names of all graph nodes the match covers.
        apply: whether [apply_transformation_plan][embedl_dynamo.apply_transformation_plan]
            will apply it (users may toggle it).
        reason: why it is not applied (empty when it is).
        applied: True once the rewrite has been made (conversions are applied while planning).
        check_reason: the reason ``check`` declined, kept apart from overlap and user decisions.

    Example:
        ```python
        plan = embedl_dynamo.get_transformation_plan(model.eval(), (x,))
        for entry in plan.entries:
            print(entry.id, entry.apply, entry.reason)
        ```
    """

    id: str
    pattern: Pattern
    node: str
    nodes: tuple[str, ...]
    apply: bool
    reason: str = ""
    applied: bool = False
    check_reason: str = ""
    claimed_by: str = ""

    @property
    def phase(self) -> str:
        return self.pattern.phase

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pattern": self.pattern.name,
            "phase": self.pattern.phase,
            "node": self.node,
            "nodes": list(self.nodes),
            "apply": self.apply,
            "applied": self.applied,
            "reason": self.reason,
        }


@dataclass
class TransformationPlan:
    """Matches of a pattern list on a (canonicalised, converted) deep copy of the graph.

    Attributes:
        model: the graph the fusion matches refer to; never the user's model.
        matches: ``node_name -> pattern_name -> PatternMatch``.
        entries: the same matches as a list in priority order (longest pattern first).

    Example:
        ```python
        plan = embedl_dynamo.get_transformation_plan(model.eval(), (x,))
        print(plan.table())
        plan.disable("conv_bn@*")
        ```
    """

    model: fx.GraphModule
    entries: list[PatternMatch] = field(default_factory=list)

    @property
    def matches(self) -> dict[str, dict[str, PatternMatch]]:
        """The entries as ``node name -> pattern name -> PatternMatch`` (the seed API's view);
        setting ``.apply = False`` on one skips it, as
        [disable][embedl_dynamo.TransformationPlan.disable] does by glob."""
        table: dict[str, dict[str, PatternMatch]] = {}
        for entry in self.entries:
            table.setdefault(entry.node, {})[entry.pattern.name] = entry
        return table

    def __getitem__(self, match_id: str) -> PatternMatch:
        for entry in self.entries:
            if entry.id == match_id:
                return entry
        known = ", ".join(e.id for e in self.entries[:20])
        raise KeyError(f"no match with id {match_id!r} in the plan; known ids include: {known}")

    def select(self, glob: str) -> list[PatternMatch]:
        """The entries whose id matches the shell-style ``glob``."""
        return [e for e in self.entries if fnmatch.fnmatchcase(e.id, glob)]

    def disable(self, glob: str, reason: str = "disabled by user") -> list[PatternMatch]:
        """Skip the not-yet-applied matches whose id matches ``glob``; returns them."""
        return self._toggle(glob, False, reason)

    def enable(self, glob: str) -> list[PatternMatch]:
        """Apply the matches whose id matches ``glob`` (their checks must have passed)."""
        return self._toggle(glob, True, "")

    def _toggle(self, glob: str, apply: bool, reason: str) -> list[PatternMatch]:
        selected = [e for e in self.select(glob) if not e.applied]
        if not selected:
            raise KeyError(
                f"no pending match id matches {glob!r}; ids look like "
                f"{self.entries[0].id if self.entries else '<pattern>@<module path>'}"
            )
        for entry in selected:
            if apply and entry.check_reason:
                raise ValueError(f"{entry.id} cannot be applied: {entry.check_reason}")
            entry.apply = apply
            entry.reason = reason
            entry.claimed_by = ""
        self.resolve_overlaps()
        return selected

    def resolve_overlaps(self) -> None:
        """Derive overlap skips in priority order: the one overlap resolver.

        Planning calls it once (entries are in priority order, longest pattern first), and every
        toggle again: a match skipped only because a now-disabled match claimed its nodes
        becomes applicable again; an enabled match takes precedence over later ones it overlaps.
        """
        claimed: dict[str, str] = {}
        for entry in self.entries:
            if entry.applied or entry.check_reason:
                continue
            if not entry.apply and not entry.claimed_by:
                continue  # a user decision
            clash = next((claimed[n] for n in entry.nodes if n in claimed), None)
            if clash is not None:
                entry.apply, entry.claimed_by = False, clash
                entry.reason = f"{OVERLAP_PREFIX}{clash}"
            else:
                entry.apply, entry.claimed_by, entry.reason = True, "", ""
                for n in entry.nodes:
                    claimed[n] = entry.id

    def table(self) -> str:
        """A readable table: one row per match with id, pattern, anchor node, apply and reason."""
        return format_table(self.entries)

    def __str__(self) -> str:
        return self.table()

    def snapshot(self) -> PlanSnapshot:
        """The plan's rows as they are now, without the graph (what a report keeps)."""
        return PlanSnapshot.of(self)

    def summary(self) -> dict[str, Any]:
        """Counts of applied and skipped matches, overall and per pattern."""
        return self.snapshot().summary()


@dataclass
class TransformResult:
    """What [transform][embedl_dynamo.transform.transform] returns: the transformed model, its
    plan and a report.

    Example:
        ```python
        result = embedl_dynamo.transform(model.eval(), (x,))
        print(result.report["applied_count"], result.plan.summary())
        ```
    """

    model: fx.GraphModule
    plan: TransformationPlan
    report: dict[str, Any] = field(default_factory=dict)
