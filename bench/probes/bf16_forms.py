"""bf16 on OpenVINO: the typed graph against the f32 graph with OpenVINO's bf16 hint.

For each model (random weights, batch 1): eager, OpenVINO's own default (``ov_default``:
``ov.convert_model`` compiled with its default hints, bf16 on a CPU with AVX512_BF16 or AMX),
and our ``precision="bf16"`` on the ``openvino`` runtime in each form: forced (``typed``: the
bf16-typed graph; ``hint``: the f32 graph with the bf16 hint) and as chosen (``chosen``: the
compile-time contest of :mod:`embedl_dynamo.tuning.half_form`, whose report line is the row's
info), timed together by the one timer, as ratios to eager, with cosines to eager.
"""

from __future__ import annotations

import argparse
import gc
import tempfile

import torch

from bench import models
from bench.harness.measure import cosine, first_tensor, one_line
from bench.harness.record import Record
from bench.harness.table import by_variant
from bench.harness.timer import interleaved
from bench.suites.common import split_names
from bench.variants.openvino import openvino_model, request_call

__all__ = ["BASELINE", "arguments", "run", "smoke", "table"]

BASELINE = "eager"


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--models", default="resnet50,mobilenet_v3_large,bert_base")
    parser.add_argument("--rounds", type=int, default=12)


def smoke(args: argparse.Namespace) -> None:
    """The tiny CNN, one round."""
    args.models, args.rounds = "tiny_cnn", 1


def _one_form(form: str | None):
    """``half_form_options`` keeping the ``form`` option only (None: both, the real choice)."""
    from embedl_dynamo.tuning import half_form

    real = half_form.half_form_options

    def options(*args):
        found = real(*args)
        if form is None or found is None:
            return found
        return [o for o in found if ("typed" in o.label) == (form == half_form.TYPED)]

    return options


def _ours(model, inputs, form: str | None, cache_dir: str):
    """Ours at bf16 on OpenVINO in one form: (call, output, where)."""
    import embedl_dynamo
    from embedl_dynamo.tuning import half_form

    torch._dynamo.reset()
    embedl_dynamo.clear_reports()
    options = {"precision": "bf16", "runtime": "openvino", "cache_dir": cache_dir}
    real = half_form.half_form_options
    half_form.half_form_options = _one_form(form)
    try:
        compiled = torch.compile(model, backend="embedl_openvino", options=options)
        with torch.no_grad():
            got = first_tensor(compiled(*inputs))
    finally:
        half_form.half_form_options = real
    where = "; ".join(s.reason or s.runtime for s in embedl_dynamo.last_report().subgraphs)
    return (lambda: compiled(*inputs)), got, where


def _model(record: Record, name: str, rounds: int) -> None:
    from embedl_dynamo.tuning import half_form

    model, inputs = models.build(name)
    with torch.no_grad():
        expected = first_tensor(model(*inputs))
    peer = request_call(openvino_model(model, inputs), inputs, None)
    calls = {"eager": lambda: model(*inputs), "ov_default": peer}
    record.add(name, "ov_default", "cosine", cosine(first_tensor(peer()), expected), "cosine")
    forms = {"typed": half_form.TYPED, "hint": half_form.HINT, "chosen": None}
    where = {}
    with tempfile.TemporaryDirectory(prefix=f"embedl_bench_bf16_{name}_") as cache_dir:
        for variant, form in forms.items():
            call, got, where[variant] = _ours(model, inputs, form, cache_dir)
            record.add(name, f"ours-bf16 {variant}", "cosine", cosine(got, expected), "cosine")
            calls[f"ours-bf16 {variant}"] = call
        gc.collect()
        timings = interleaved(calls, rounds, mode=torch.no_grad)
    for variant in calls:
        info = {"decided": where["chosen"]} if variant == "ours-bf16 chosen" else None
        record.add(name, variant, "latency", timings.median(variant) * 1e3, "ms", info=info)


def run(args: argparse.Namespace, record: Record) -> None:
    """One row set per model; a model that fails is an error row."""
    for name in split_names(args.models):
        try:
            _model(record, name, args.rounds)
        except Exception as error:  # one model's failure is a row, not the end of the run
            record.fail(name, "ours-bf16 chosen", one_line(error))
        torch._dynamo.reset()


def table(record: Record, view: str = "main") -> str:
    """``main``: time / eager per form; ``cosine``: cosine to eager."""
    if view == "cosine":
        return by_variant(record, "cosine", show="value")
    return by_variant(record, "latency")
