"""The subgraph reports of one record, summarised: :class:`CompileReport` (first screen, HTML page)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from embedl_dynamo.report.html import render_html
from embedl_dynamo.report.subgraph import SubgraphReport

__all__ = ["CompileReport"]


@dataclass
class CompileReport:
    """The subgraph reports of one record, oldest first."""

    subgraphs: list[SubgraphReport] = field(default_factory=list)

    def __str__(self) -> str:
        return self.summary()

    def summary(self, max_subgraphs: int = 8) -> str:
        """The first screen (a dozen lines): where each subgraph ran (and how ``runtime="auto"``
        chose: measured, a cached decision or a rule), an ``int8`` slower than float, the
        rewrites applied by kind, the precision mix and the compile time; the full plan is one
        call away."""
        if not self.subgraphs:
            return "no subgraph compiled by an embedl_* backend yet"
        subs = self.subgraphs
        compiled = [s for s in subs if s.status == "compiled" and s.runtime != "eager"]
        runtimes = sorted({s.runtime for s in compiled})
        lines = [
            f"embedl_dynamo: {len(subs)} subgraph{'s' if len(subs) != 1 else ''}, "
            f"{len(compiled)} compiled ({', '.join(runtimes) or 'none'}), "
            f"{len(subs) - len(compiled)} in PyTorch; "
            f"compile {sum(s.compile_s for s in subs):.1f} s"
        ]
        lines += self.int8_slower()
        lines += [f"  {s}" for s in subs[:max_subgraphs]]
        if len(subs) > max_subgraphs:
            lines.append(f"  ... {len(subs) - max_subgraphs} more (report.subgraphs)")
        kinds: dict[str, int] = {}
        for s in subs:
            for name, count in s.pipeline.get("applied_by_pattern", {}).items():
                kinds[name] = kinds.get(name, 0) + count
        if kinds:
            ranked = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
            shown = ", ".join(f"{name} x{count}" for name, count in ranked[:6])
            more = f", +{len(ranked) - 6} kinds" if len(ranked) > 6 else ""
            lines.append(f"rewrites: {shown}{more}")
        lines.append(f"precision: {self.precision_mix()}")
        lines.append("full plan: print(report[i].plan)")
        return "\n".join(lines)

    def int8_slower(self) -> list[str]:
        """One line per subgraph whose ``int8`` artifact was timed slower than the float one on
        its runtime (``pipeline["int8_speed"]``): both numbers and the way out, ``mixed``."""
        lines = []
        for s in self.subgraphs:
            speed = s.pipeline.get("int8_speed") or {}
            int8, fp32 = speed.get("int8_ms", 0.0), speed.get("fp32_ms", 0.0)
            if fp32 > 0 and int8 > fp32:
                lines.append(
                    f"warning: subgraph {s.index}: int8 is {int8 / fp32:.2f}x slower than float on "
                    f"{speed['runtime']} ({int8:.2f} ms against {fp32:.2f} ms); it runs as asked. "
                    "precision='mixed' keeps INT8 only where it pays"
                )
        return lines

    def to_html(self, path: str | os.PathLike[str]) -> Path:
        """Write the report as one self-contained HTML page (see :mod:`.html`).

        Args:
            path: the file to write (UTF-8).

        Returns:
            ``path`` as a :class:`~pathlib.Path`.
        """
        target = Path(path)
        target.write_text(render_html(self.subgraphs, self.summary()), encoding="utf-8")
        return target

    def precision_mix(self) -> str:
        """``fp32``, or the precision asked for and how many layers run at each precision.

        Counts come from the per-layer records (``fp16``/``bf16``/``mixed``) or, for ``int8``,
        from the quantization report.
        """
        counts: dict[str, int] = {}
        asked = {s.pipeline.get("precision", "fp32") for s in self.subgraphs if s.pipeline}
        for sub in self.subgraphs:
            layers = sub.pipeline.get("layers") or []
            quant = sub.pipeline.get("quantization") or {}
            if not layers and sub.pipeline.get("quantized"):
                layers = [{"precision": "int8"}] * len(quant.get("quantized_layers", [])) + [
                    {"precision": "fp32"}
                ] * len(quant.get("float_layers", []))
            for layer in layers:
                counts[layer["precision"]] = counts.get(layer["precision"], 0) + 1
        asked.discard("fp32")
        if not asked and not counts:
            return "fp32"
        mode = "/".join(sorted(asked)) or "fp32"
        shown = ", ".join(f"{n} {p}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        return f"{mode} ({shown} layers)" if shown else mode

    def __len__(self) -> int:
        return len(self.subgraphs)

    def __iter__(self):
        return iter(self.subgraphs)

    def __getitem__(self, i: int) -> SubgraphReport:
        return self.subgraphs[i]
