"""The one result record of ``bench/``: an environment block and rows, written as JSON.

A row is one number: ``suite``, ``model``, ``variant``, ``params`` (what else identifies the
measurement: batch, new tokens, clients), ``metric``, ``value``, ``unit`` and ``ratio``, the
value over the baseline variant's value of the same model, params and metric **in the same
run** (times only; None where there is no baseline). Optional: ``tool`` (a peer that timed
itself, named with its version), ``error`` (a variant that failed: value None, metric
``error``), ``info`` (what the variant reported: where it ran, its INT8 layers). This is
Torch-TensorRT ``tools/perf``'s one result row and TorchBench's metrics JSON in one file;
:func:`validate` is its schema, and ``compare``, ``plot`` and the docs tables read only it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ROW_KEYS", "SCHEMA", "TIME_UNITS", "Record", "validate"]

SCHEMA = "embedl_dynamo.bench/1"
ROW_KEYS = ("suite", "model", "variant", "params", "metric", "value", "unit", "ratio")
OPTIONAL_ROW_KEYS = ("tool", "error", "info")
TIME_UNITS = frozenset({"s", "ms", "us", "ms/token"})
_ENVIRONMENT_KEYS = ("date", "command", "commit", "versions", "cpu", "machine")


def _identity(row: dict[str, Any]) -> tuple:
    return row["model"], json.dumps(row["params"], sort_keys=True), row["metric"]


@dataclass
class Record:
    """One run of one suite or probe (see the module docstring)."""

    suite: str
    environment: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    baseline: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(
        self,
        model: str,
        variant: str,
        metric: str,
        value: float | None,
        unit: str,
        *,
        params: dict[str, Any] | None = None,
        tool: str | None = None,
        info: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Append one measured number; returns its row."""
        if isinstance(value, bool):
            value = float(value)
        row = {
            "suite": self.suite,
            "model": model,
            "variant": variant,
            "params": dict(params or {}),
            "metric": metric,
            "value": value,
            "unit": unit,
            "ratio": None,
        }
        if tool:
            row["tool"] = tool
        if info:
            row["info"] = info
        self.rows.append(row)
        return row

    def fail(
        self, model: str, variant: str, error: str, *, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Append a variant that failed: a cell with its one-line reason, not a lost row."""
        row = self.add(model, variant, "error", None, "", params=params)
        row["error"] = error
        return row

    def finish(self) -> None:
        """Set each time row's ``ratio`` (four significant digits) to the baseline variant's
        value in this run."""
        if self.baseline is None:
            return
        base = {
            _identity(r): r["value"]
            for r in self.rows
            if r["variant"] == self.baseline and r["unit"] in TIME_UNITS and r["value"]
        }
        for row in self.rows:
            reference = base.get(_identity(row))
            if row["unit"] in TIME_UNITS and row["value"] is not None and reference:
                row["ratio"] = float(f"{row['value'] / reference:.4g}")

    def find(self, **match: Any) -> list[dict[str, Any]]:
        """The rows whose fields equal ``match`` (``params`` compared as a whole dict)."""
        return [r for r in self.rows if all(r.get(k) == v for k, v in match.items())]

    def value(self, model: str, variant: str, metric: str, params: dict | None = None) -> Any:
        """The value of one row (None where there is none)."""
        found = self.find(model=model, variant=variant, metric=metric, params=params or {})
        return found[0]["value"] if found else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document."""
        return {
            "schema": SCHEMA,
            "suite": self.suite,
            "baseline": self.baseline,
            "environment": self.environment,
            "settings": self.settings,
            "notes": self.notes,
            "rows": self.rows,
            "extra": self.extra,
        }

    def write(self, path: str | Path) -> Path:
        """Validate and write the record to ``path`` (folders made); returns the path."""
        document = self.to_dict()
        validate(document)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Record:
        """Read and validate a record file."""
        document = json.loads(Path(path).read_text())
        try:
            validate(document)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        return cls(
            document["suite"],
            document["environment"],
            document.get("settings", {}),
            document.get("baseline"),
            document["rows"],
            document.get("notes", []),
            document.get("extra", {}),
        )


def _check_row(index: int, row: Any) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"row {index} is not an object")
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise ValueError(f"row {index} lacks {', '.join(missing)}; every row has {ROW_KEYS}")
    unknown = set(row) - set(ROW_KEYS) - set(OPTIONAL_ROW_KEYS)
    if unknown:
        raise ValueError(f"row {index} has unknown keys {sorted(unknown)}")
    for key in ("suite", "model", "variant", "metric", "unit"):
        if not isinstance(row[key], str):
            raise ValueError(f"row {index}: {key} must be a string, not {row[key]!r}")
    if not isinstance(row["params"], dict):
        raise ValueError(f"row {index}: params must be an object")
    for key in ("value", "ratio"):
        value = row[key]
        if value is not None and (not isinstance(value, int | float) or not math.isfinite(value)):
            raise ValueError(f"row {index}: {key} must be a finite number or null, not {value!r}")
    if row["metric"] == "error" and not row.get("error"):
        raise ValueError(f"row {index}: an error row names its error")


def validate(document: Any) -> None:
    """Raise ValueError naming the first way ``document`` is not a result record."""
    if not isinstance(document, dict):
        raise ValueError("a result record is a JSON object")
    if document.get("schema") != SCHEMA:
        raise ValueError(f"schema is {document.get('schema')!r}, not {SCHEMA!r}")
    for key in ("suite", "environment", "rows"):
        if key not in document:
            raise ValueError(f"the record lacks {key!r}")
    environment = document["environment"]
    missing = [k for k in _ENVIRONMENT_KEYS if k not in environment]
    if missing:
        raise ValueError(f"the environment block lacks {', '.join(missing)}")
    if not isinstance(document["rows"], list):
        raise ValueError("rows must be a list")
    for index, row in enumerate(document["rows"]):
        _check_row(index, row)
        if row["suite"] != document["suite"]:
            raise ValueError(
                f"row {index} is of suite {row['suite']!r}, the record's is {document['suite']!r}"
            )
