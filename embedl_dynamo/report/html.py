"""One self-contained HTML page for a compile report: its summary and its subgraph reports.

No network, no scripts: inline CSS and SVG only, so the file can be mailed, attached to a CI
run or opened offline. It shows the first screen's summary, every plan entry of every subgraph
(id, pattern, applied or why not, precision and why, sensitivity and latency where known), a bar
chart of per-layer latency coloured by precision when latencies were measured, and what stayed in
PyTorch and why. The layout reflows from a phone's width to a 4k monitor.

It renders plain data (the summary text and the :class:`SubgraphReport` list), so it sits below
:class:`~embedl_dynamo.report.compile_report.CompileReport`, whose ``to_html`` calls it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from embedl_dynamo.report.subgraph import SubgraphReport

__all__ = ["layer_rows", "render_html"]

_COLOURS = {"int8": "#2f7d32", "fp16": "#1565c0", "bf16": "#6a1b9a", "fp32": "#757575"}

_CSS = """
:root { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #1c1c1c; }
body { margin: 0 auto; padding: clamp(8px, 2vw, 40px); max-width: 2400px;
       font-size: clamp(14px, 0.5vw + 11px, 24px); line-height: 1.4; }
h1 { font-size: 1.5em; margin: 0 0 .4em; } h2 { font-size: 1.2em; margin: 1.4em 0 .4em; }
pre { background: #f5f5f5; padding: .8em; overflow-x: auto; white-space: pre-wrap; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; min-width: 44em; font-size: .9em; }
th, td { text-align: left; padding: .3em .6em; border-bottom: 1px solid #ddd; vertical-align: top; }
th { background: #fafafa; position: sticky; top: 0; }
td.id { font-family: ui-monospace, monospace; overflow-wrap: anywhere; min-width: 14em; }
.applied { color: #2f7d32; } .skipped { color: #8d6e63; }
.chart { margin: 1em 0; }
.bar-row { display: grid; grid-template-columns: minmax(8em, 22em) 1fr 9em; gap: .5em;
  align-items: center; font-size: .85em; }
.bar-label { font-family: ui-monospace, monospace; overflow-wrap: anywhere; }
.bar-track { background: #f1f1f1; height: .9em; }
.bar { display: block; height: 100%; }
.key { margin-left: 1em; } .swatch { display: inline-block; width: .8em; height: .8em;
  margin-right: .3em; vertical-align: middle; }
@media (max-width: 40em) { .bar-row { grid-template-columns: 1fr; } }
"""


def layer_rows(sub: SubgraphReport) -> list[dict[str, Any]]:
    """One row per plan entry: id, pattern, state, reason, precision (+why), sensitivity, latency.

    Precision comes from the quantization report when the subgraph was quantized (``int8`` for
    quantized layers, ``fp32`` with the reason for those left in float), else ``fp32``.
    """
    quant = sub.pipeline.get("quantization") or {}
    int8 = set(quant.get("quantized_layers", []))
    kept = {f["id"]: f["reason"] for f in quant.get("float_layers", [])}
    # per-layer precision records name layers by placement id (``quant_conv_ort@layer1.0``):
    # they meet the plan's ids (``conv_bn_relu@layer1.0``) at the module path
    per_layer = {str(r.get("id")).split("@", 1)[-1]: r for r in sub.pipeline.get("layers", [])}
    rows = []
    plan = sub.plan
    for entry in plan.entries if plan is not None else []:
        path = entry.id.split("@", 1)[-1]
        extra = per_layer.get(path, {})
        precision, why = "fp32", "float model"
        if not (entry.applied or entry.apply):
            precision, why = "", ""  # not in the graph: no precision of its own
        elif any(i.endswith("@" + path) for i in int8):
            precision, why = "int8", "quantized"
        elif any(i.endswith("@" + path) for i in kept):
            why = next(r for i, r in kept.items() if i.endswith("@" + path))
        rows.append(
            {
                "id": entry.id,
                "pattern": entry.pattern.name,
                "state": "applied" if (entry.applied or entry.apply) else "skipped",
                "reason": entry.reason,
                "precision": extra.get("precision", precision),
                "precision_reason": extra.get("reason", why),
                "sensitivity": extra.get("sensitivity"),
                "latency_ms": extra.get("latency_ms"),
            }
        )
    return rows


def _chart(sub: SubgraphReport) -> str:
    """Latency per measured layer as labelled bars (plain CSS widths: no scaling surprises on a
    phone or a 4k screen), coloured by the precision it runs at, with a legend."""
    timed = [
        r for r in sub.pipeline.get("layers", []) if isinstance(r.get("latency_ms"), (int, float))
    ]
    if not timed:
        return "<p>No per-layer latency was measured for this report.</p>"
    top = max(r["latency_ms"] for r in timed) or 1.0
    esc = html.escape
    rows = []
    for r in timed:
        colour = _COLOURS.get(r["precision"], "#9e9e9e")
        width = max(0.5, 100.0 * r["latency_ms"] / top)
        rows.append(
            f'<div class="bar-row"><span class="bar-label">{esc(str(r["id"]))}</span>'
            f'<span class="bar-track"><span class="bar" style="width:{width:.1f}%;'
            f'background:{colour}"></span></span><span class="bar-value">'
            f"{r['latency_ms']:.3f} ms {esc(r['precision'])}</span></div>"
        )
    used = sorted({r["precision"] for r in timed})
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:'
        f'{_COLOURS.get(p, "#9e9e9e")}"></span>{esc(p)}</span>'
        for p in used
    )
    return (
        f'<figure class="chart" aria-label="latency per layer"><figcaption>Latency per layer '
        f"(ms, as it runs) {legend}</figcaption>{''.join(rows)}</figure>"
    )


def render_html(
    subgraphs: Sequence[SubgraphReport], summary: str, title: str = "embedl_dynamo compile report"
) -> str:
    """The page as a string.

    Args:
        subgraphs: the subgraph reports, oldest first.
        summary: the first screen (:meth:`CompileReport.summary
            <embedl_dynamo.report.compile_report.CompileReport.summary>`).
        title: the page's title and heading.

    Returns:
        One HTML document, with inline CSS and nothing loaded from elsewhere.
    """
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<section id="summary"><pre>{esc(summary)}</pre></section>',
    ]
    fallbacks = [s for s in subgraphs if s.runtime == "eager" or s.reason]
    if fallbacks:
        parts.append('<section id="fallbacks"><h2>What stayed in PyTorch, and why</h2><ul>')
        parts += [f"<li>subgraph {s.index}: {esc(s.reason or s.status)}</li>" for s in fallbacks]
        parts.append("</ul></section>")
    for sub in subgraphs:
        rows = layer_rows(sub)
        parts.append(f'<section class="subgraph" id="subgraph-{sub.index}">')
        parts.append(f"<h2>Subgraph {sub.index}: {esc(sub.status)} on {esc(sub.runtime)}</h2>")
        parts.append(_chart(sub))
        parts.append('<div class="scroll"><table><thead><tr>')
        headers = ("id", "pattern", "applied", "reason", "precision", "why", "sensitivity", "ms")
        parts += [f"<th>{h}</th>" for h in headers]
        parts.append("</tr></thead><tbody>")
        for r in rows:
            sens = "" if r["sensitivity"] is None else f"{r['sensitivity']:.4g}"
            ms = "" if r["latency_ms"] is None else f"{r['latency_ms']:.3f}"
            parts.append(
                f'<tr><td class="id">{esc(r["id"])}</td><td>{esc(r["pattern"])}</td>'
                f'<td class="{r["state"]}">{r["state"]}</td><td>{esc(r["reason"])}</td>'
                f"<td>{esc(r['precision'])}</td><td>{esc(r['precision_reason'])}</td>"
                f"<td>{sens}</td><td>{ms}</td></tr>"
            )
        parts.append("</tbody></table></div></section>")
    parts.append("</body></html>")
    return "\n".join(parts)
