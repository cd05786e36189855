"""What a report keeps of a transformation plan: its rows, not its graph (:class:`PlanSnapshot`).

A :class:`~embedl_dynamo.rewrite.plan.TransformationPlan` holds the graph it was planned on, and
that graph holds the frozen weights. A report outlives the model it describes, so it keeps
only the plan's rows (ids, pattern names, nodes as names, applied or not, and why): printing
it gives the same table, and nothing of the model stays alive because a report exists.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PatternName", "PlanRow", "PlanSnapshot", "format_table"]


@dataclass(frozen=True)
class PatternName:
    """The pattern a row refers to, by name and phase (``row.pattern.name``)."""

    name: str
    phase: str = ""

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class PlanRow:
    """One plan entry as plain data (the fields of
    :class:`~embedl_dynamo.rewrite.plan.PatternMatch`, the pattern by name)."""

    id: str
    pattern: PatternName
    node: str
    nodes: tuple[str, ...]
    apply: bool
    reason: str = ""
    applied: bool = False

    @property
    def phase(self) -> str:
        return self.pattern.phase

    @classmethod
    def of(cls, entry: Any) -> PlanRow:
        """The row of a plan entry (a ``PatternMatch``, or a row already): its ``to_dict``."""
        return cls.from_dict(entry.to_dict())

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> PlanRow:
        """The row :meth:`to_dict` (or ``PatternMatch.to_dict``) wrote."""
        return cls(
            id=str(row["id"]),
            pattern=PatternName(str(row["pattern"]), str(row.get("phase", ""))),
            node=str(row.get("node", "")),
            nodes=tuple(str(n) for n in row.get("nodes", ())),
            apply=bool(row.get("apply")),
            reason=str(row.get("reason", "")),
            applied=bool(row.get("applied")),
        )

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


def format_table(entries: Any) -> str:
    """The plan table: one row per entry with id, pattern, anchor node, apply and reason."""
    header = ("id", "pattern", "node", "apply", "reason")
    rows = [
        (
            e.id,
            e.pattern.name,
            e.node,
            "applied" if e.applied else ("yes" if e.apply else "no"),
            e.reason,
        )
        for e in entries
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class PlanSnapshot:
    """A plan's rows as they were when the report took them; read-only, graph-free.

    ``print(snapshot)`` shows the same table as the plan; ``entries``, ``snapshot[id]``,
    :meth:`select` and :meth:`summary` read it as the plan's own methods do.
    """

    entries: tuple[PlanRow, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, plan: Any) -> PlanSnapshot | None:
        """The snapshot of ``plan`` (a ``TransformationPlan`` or a snapshot); None for None."""
        if plan is None or isinstance(plan, PlanSnapshot):
            return plan
        return cls(tuple(PlanRow.of(e) for e in plan.entries))

    @classmethod
    def from_dicts(cls, rows: list[dict[str, Any]]) -> PlanSnapshot:
        """The snapshot of rows written by :meth:`PlanRow.to_dict` (a cache alias's ``plan``)."""
        return cls(tuple(PlanRow.from_dict(r) for r in rows))

    def __getitem__(self, match_id: str) -> PlanRow:
        for entry in self.entries:
            if entry.id == match_id:
                return entry
        known = ", ".join(e.id for e in self.entries[:20])
        raise KeyError(f"no match with id {match_id!r} in the plan; known ids include: {known}")

    def select(self, glob: str) -> list[PlanRow]:
        """The rows whose id matches the shell-style ``glob``."""
        return [e for e in self.entries if fnmatch.fnmatchcase(e.id, glob)]

    def table(self) -> str:
        """The plan table (:func:`format_table`)."""
        return format_table(self.entries)

    def __str__(self) -> str:
        return self.table()

    def summary(self) -> dict[str, Any]:
        """Counts of applied and skipped rows, overall and per pattern, and the rows."""
        per_pattern: dict[str, dict[str, int]] = {}
        for e in self.entries:
            counts = per_pattern.setdefault(e.pattern.name, {"applied": 0, "skipped": 0})
            counts["applied" if (e.apply or e.applied) else "skipped"] += 1
        return {
            "applied_count": sum(c["applied"] for c in per_pattern.values()),
            "skipped_count": sum(c["skipped"] for c in per_pattern.values()),
            "patterns": per_pattern,
            "matches": [e.to_dict() for e in self.entries],
        }
