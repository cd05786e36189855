"""Our variants: ``ours-<precision>[@<target>][+dynamic]``, ``torch.compile`` through an
``embedl_*`` backend.

``torch.compile(model, backend="embedl_<target>", options={"precision": p, ...})``, where the
target is the one named (``@openvino``, ``@onnxruntime``, ``@tensorrt``; ``@embedl_openvino``
reads the same) or else the suite's ``--backend`` under ``runtime="auto"``. Each variant
compiles into a cache directory of its own, so its first call is a cold compile. A precision
that calibrates gets the case's calibration batches; one below float gets the suite's
``accuracy_budget`` where it sets one. After the first call the compile report says where each
subgraph ran and how many layers run in INT8 (:func:`describe_report`); ``+dynamic`` (the LLM
suite) passes ``dynamic=True``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from bench.harness.measure import first_tensor
from bench.harness.timer import timed_call
from bench.variants import Built, Case

if TYPE_CHECKING:
    from embedl_dynamo.report.compile_report import CompileReport

__all__ = ["Compiled", "build", "compile_ours", "describe_report", "int8_layer_fraction", "parse"]


def parse(name: str) -> tuple[str, str | None, bool]:
    """``(precision, dynamo backend or None, dynamic)`` of an ``ours-...`` variant name."""
    spec = name.removeprefix("ours-")
    dynamic = spec.endswith("+dynamic")
    precision, _, target = spec.removesuffix("+dynamic").partition("@")
    if not target:
        return precision, None, dynamic
    return precision, target if target.startswith("embedl_") else f"embedl_{target}", dynamic


def options_for(precision: str, case: Case, named: bool) -> dict[str, Any]:
    """The compile options of ``ours-<precision>`` for ``case`` (a fresh cache directory)."""
    from embedl_dynamo.precision import get_precision

    spec = get_precision(precision)
    options: dict[str, Any] = {
        "precision": precision,
        "cache_dir": tempfile.mkdtemp(prefix="ours_", dir=case.workdir),
    }
    if not named:
        options["runtime"] = "auto"
    if spec.calibrates:
        options["calibration_data"] = case.calibration
    if case.accuracy_budget is not None and spec.lower:
        options["accuracy_budget"] = case.accuracy_budget
    return options


def int8_layer_fraction(report: CompileReport) -> str:
    """How many of the compiled layers run in INT8, as a table cell: ``"int8/all"``.

    Counts over every subgraph: the per-layer decisions of ``mixed`` where there are some, else
    the quantized and float-kept layers of ``int8``. A subgraph whose INT8 artifact the
    accuracy check rejected (it runs fp32) makes the cell say so instead of a fraction.
    """
    rejected = [s for s in report.subgraphs if s.lower_rejected]
    if rejected:
        return f"rejected ({len(rejected)} subgraph(s) run fp32)"
    layers = [r for s in report.subgraphs for r in s.pipeline.get("layers", [])]
    if layers:
        return f"{sum(r['precision'] == 'int8' for r in layers)}/{len(layers)}"
    quant = [s.pipeline.get("quantization") or {} for s in report.subgraphs]
    int8 = sum(len(q.get("quantized_layers", [])) for q in quant)
    kept = sum(len(q.get("float_layers", [])) for q in quant)
    return f"{int8}/{int8 + kept}"


def describe_report(report: CompileReport, quantizes: bool) -> dict[str, Any]:
    """What a compile report says of a variant: where it ran, its INT8 layers."""
    info: dict[str, Any] = {"where": ", ".join(sorted({s.runtime for s in report.subgraphs}))}
    if quantizes:
        info["int8_layers"] = int8_layer_fraction(report)
    return info


def build(case: Case, name: str) -> Built:
    """``ours-<precision>[@<target>]`` for ``case``: compiled lazily by its first call."""
    import embedl_dynamo
    from embedl_dynamo.precision import get_precision

    precision, backend, dynamic = parse(name)
    options = options_for(precision, case, named=backend is not None)
    embedl_dynamo.clear_reports()
    compiled = torch.compile(
        case.model, backend=backend or case.backend, options=options, dynamic=dynamic or None
    )
    quantizes = get_precision(precision).quantizes

    def describe() -> dict[str, Any]:
        embedl_dynamo.wait_for_cache_writes()  # ours writes its cache after the first call
        return describe_report(embedl_dynamo.last_report(), quantizes)

    inputs = case.inputs
    return Built(lambda: compiled(*inputs), describe)


@dataclass
class Compiled:
    """Our backend's compile of a model, called once (for the probes).

    Attributes:
        call: the call to time (the compiled model on the example inputs).
        output: the first output tensor of the first call.
        first_s: seconds of the first call (compile included).
        report: the compile report of that call.
    """

    call: Callable[[], object]
    output: torch.Tensor
    first_s: float
    report: CompileReport


def compile_ours(
    model: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    options: dict[str, Any],
    backend: str = "embedl_tensorrt",
) -> Compiled:
    """``torch.compile(model, backend=backend, options=options)`` called once on ``inputs``
    under ``torch.no_grad``. Dynamo is not reset here: a reset makes every earlier compile of
    the same model compile again on its next call."""
    import embedl_dynamo

    embedl_dynamo.clear_reports()
    compiled = torch.compile(model, backend=backend, options=options)
    with torch.no_grad():
        output, first_s = timed_call(compiled, *inputs)
    report = embedl_dynamo.last_report()
    return Compiled(lambda: compiled(*inputs), first_tensor(output), first_s, report)
