"""The suites and probes ``python -m bench run`` knows, and what each one provides.

A plug-in is a module (TorchBench's userbenchmarks are modules with a ``run``):

* its docstring, whose first line is its summary;
* ``BASELINE``: the variant every time is a ratio to (``"eager"``), or None;
* ``arguments(parser)``: its own options, added to the runner's;
* ``smoke(args)`` (optional): shrink ``args`` to a run of seconds (``--smoke``);
* ``run(args, record)``: measure, adding rows to the :class:`~bench.harness.record.Record`;
* ``table(record, view="main")`` (optional): its Markdown table (default: by variant of its
  first time metric); ``plot(record, path)`` (optional): its chart.

Suites are the tables the docs show; probes are one-off investigations on the same runner,
timer and record. Modules are imported only when asked for, so ``python -m bench list`` and
the peers' own environments import no torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["PROBES", "SUITES", "kind", "names", "plugin", "summary"]

SUITES = {
    "cpu_table": "bench.suites.cpu_table",
    "transformers": "bench.suites.transformers",
    "llm_decode": "bench.suites.llm_decode",
    "cold_start": "bench.suites.cold_start",
    "serving": "bench.suites.serving",
    "serving_wire": "bench.suites.serving_wire",
    "coverage": "bench.suites.coverage",
}
PROBES = {
    name: f"bench.probes.{name}"
    for name in (
        "beat_eager",
        "bf16_forms",
        "call_guards",
        "decode_kernels",
        "decode_overhead",
        "digits",
        "mixed_layers",
        "modelopt_agreement",
        "ov_layer_compare",
        "refit",
        "transform",
        "weight_only_kernels",
        "weight_only_shapes",
        "zoo_speed",
    )
}


def names() -> list[str]:
    """Every suite, then every probe."""
    return [*SUITES, *PROBES]


def kind(name: str) -> str:
    """``suite`` or ``probe``."""
    return "suite" if name in SUITES else "probe"


def plugin(name: str) -> ModuleType:
    """The module of suite or probe ``name``.

    Raises:
        ValueError: ``name`` is neither; the message lists them.
    """
    module = SUITES.get(name) or PROBES.get(name)
    if module is None:
        raise ValueError(
            f"no suite or probe {name!r}; suites: {', '.join(SUITES)}; probes: {', '.join(PROBES)}"
        )
    return importlib.import_module(module)


def summary(name: str) -> str:
    """The first line of the plug-in's docstring, read without importing it."""
    import ast
    from pathlib import Path

    module = SUITES.get(name) or PROBES[name]
    path = Path(__file__).resolve().parents[2] / (module.replace(".", "/") + ".py")
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return docstring.splitlines()[0] if docstring else ""
