"""The CPU precision table of issue 25: every precision of ours against the best CPU peer at it.

For each model (random weights, BatchNorm statistics settled on random batches) and batch
size, in ONE process, the variants below are built, called once (that call's output gives the
cosine to eager; for compiled variants its seconds are the compile time, reported, never
timed), and then timed together round-robin (:func:`bench.measure.round_robin_medians`);
every time is a ratio to eager PyTorch measured in the same rounds:

* peers: OpenVINO's own conversion with ``INFERENCE_PRECISION_HINT=f32`` (``ov_f32``) and with
  its default hints (``ov_default``: bf16 on a CPU with AVX512_BF16 or AMX); NNCF +
  OpenVINO INT8 with the default hints, what an NNCF user gets (``nncf_int8``: INT8 with bf16
  elsewhere) and with the f32 hint (``nncf_int8_f32``, the same quantized model compiled
  again); ONNX Runtime's ``quantize_static`` (QDQ, CPU EP; ``ort_int8``, models with one
  input); inductor with freezing (``inductor``);
* ours: ``torch.compile(model, backend="embedl_tensorrt", options={"precision": p,
  "runtime": "auto", "cache_dir": <fresh per model, removed after it>})`` for p in fp32,
  bf16, int8 and mixed.

The calibrating variants (NNCF, ``quantize_static``, our int8 and mixed) see the same 4 random
batches. A variant that fails to build is a cell with its one-line reason, not a failed row.
Models are built one at a time, and a row's runtimes are freed before the next row is built.
Dynamo is reset only between rows: a reset would make each earlier compile of the model
compile again inside the timing loop. Each row is printed as a JSON line when done; the JSON
also holds each peer's build seconds (conversion, quantization, compile and first call, shared
by the variants of one conversion), the memory each build left held (resident GB after a
garbage collection, before and after it), the process's resident GB when timing starts, and
where our runtime choice ran each precision. All variants of a row are alive together, each
runtime with its own copy of the weights, so on a transformer the process holds many times
the model's size: run the table alone, or leave variants out with ``--skip``.

The summary compares ours with the best peer at the same precision: fp32 with OpenVINO f32
and inductor, bf16 with OpenVINO's default, int8 with NNCF + OpenVINO (either hint) and
``quantize_static``, mixed with OpenVINO's default; and mixed with the best of our single
precisions. A ratio within 3% of 1.0 is marked as within noise, the spread seen here between
identical artifacts timed in one process.

Usage::

    pip install -c constraints.txt -e ".[bench]" nncf
    python bench/bench_cpu_table.py [--models resnet50,bert_base] [--batch 1,8] [--rounds 12]
        [--skip inductor] [--json table.json] [--dict-tag-guards]
    python bench/bench_cpu_table.py --smoke      # a tiny CNN, batch 1, 2 rounds: seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.measure import (  # noqa: E402
    calibration_batches,
    compile_ours,
    cosine,
    first_tensor,
    int8_layer_fraction,
    one_line,
    resident_gb,
    round_robin_medians,
)
from bench.ort_baseline import ort_quantize_static  # noqa: E402
from bench.peers import inductor_peer, openvino_peers  # noqa: E402
from bench.zoo import SMOKE_ZOO, ZOO  # noqa: E402

MODELS = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "vit_small",
          "bert_base")  # fmt: skip
OURS = ("fp32", "bf16", "int8", "mixed")
PEERS = ("ov_f32", "ov_default", "nncf_int8", "nncf_int8_f32", "ort_int8", "inductor")
LABELS = {
    "ov_f32": "OpenVINO f32",
    "ov_default": "OpenVINO default",
    "nncf_int8": "NNCF+OV int8",
    "nncf_int8_f32": "NNCF+OV int8 f32 hint",
    "ort_int8": "ORT quantize_static",
    "inductor": "inductor+freezing",
    **{p: f"ours {p}" for p in OURS},
}
# our precision -> the peers it is compared with (the best of them that ran)
PEERS_OF = {
    "fp32": ("ov_f32", "inductor"),
    "bf16": ("ov_default",),
    "int8": ("nncf_int8", "nncf_int8_f32", "ort_int8"),
    "mixed": ("ov_default",),
}
NOISE = 0.03

Call = Callable[[], object]


def batched(inputs: Sequence[torch.Tensor], batch: int) -> tuple[torch.Tensor, ...]:
    """Random inputs like ``inputs`` with batch size ``batch`` (``inputs`` themselves at their
    own batch size); integers (token ids) in [0, 1000)."""
    if all(x.shape[0] == batch for x in inputs):
        return tuple(inputs)
    return tuple(
        torch.randn(batch, *x.shape[1:], dtype=x.dtype)
        if x.dtype.is_floating_point
        else torch.randint(0, 1000, (batch, *x.shape[1:]), dtype=x.dtype)
        for x in inputs
    )


@dataclass
class Run:
    """What every row of one model shares."""

    name: str
    family: str
    model: torch.nn.Module
    example: tuple[torch.Tensor, ...]  # the zoo's inputs, batch 1
    workdir: str  # fresh per model, removed after it: our cache (cold compiles), ORT's files
    backend: str
    rounds: int
    skip: set[str]
    budget: float | None = None  # our accuracy_budget (None: the library's default)


class _FirstOutput(torch.nn.Module):
    """``model`` returning its first output tensor only: TorchScript's ONNX exporter, which
    ``quantize_static``'s export uses, fails on Hugging Face models' keyword arguments and
    output classes (``BertModel.forward() got multiple values for argument 'use_cache'``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return first_tensor(self.model(x))


def _ort_int8(model, inputs, calibration, workdir: str) -> Call:
    if len(inputs) != 1:
        raise ValueError(
            f"the quantize_static peer takes one input; this model takes {len(inputs)}"
        )
    workdir = tempfile.mkdtemp(prefix="ort_", dir=workdir)
    batches = [batch[0] for batch in calibration]
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_static warns layer by layer on the root logger
    try:
        session = ort_quantize_static(_FirstOutput(model).eval(), batches, workdir)
    finally:
        root.setLevel(level)
    feed = {"x": inputs[0].numpy()}
    return lambda: torch.from_numpy(session.run(None, feed)[0])


def _peer_builders(run: Run, inputs, calibration) -> dict[str, Callable]:
    """Peer group -> its builder, returning variant -> call (a group shares one conversion)."""
    model, transformer = run.model, run.family == "transformer"

    def ov_float():
        calls = openvino_peers(model, inputs, [], False, transformer, ("f32", None))
        return {"ov_f32": calls["f32"], "ov_default": calls[None]}

    def nncf():
        calls = openvino_peers(model, inputs, calibration, True, transformer, (None, "f32"))
        return {"nncf_int8": calls[None], "nncf_int8_f32": calls["f32"]}

    return {
        "ov_f32,ov_default": ov_float,
        "nncf_int8,nncf_int8_f32": nncf,
        "ort_int8": lambda: {"ort_int8": _ort_int8(model, inputs, calibration, run.workdir)},
        "inductor": lambda: {"inductor": inductor_peer(model, inputs)},
    }


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else round(after - before, 2)


def _add_peers(run: Run, row: dict, fns: dict, inputs, calibration, expected) -> None:
    for group, build in _peer_builders(run, inputs, calibration).items():
        names = [n for n in group.split(",") if n not in run.skip]
        if not names:
            continue
        start, held = time.perf_counter(), resident_gb()
        try:
            calls = build()
            with torch.no_grad():  # the first call: inductor compiles here
                outputs = {n: first_tensor(calls[n]()) for n in names}
        except Exception as exc:  # a peer failing is a cell, not the row
            row.update({f"{n}_error": one_line(exc) for n in names})
            continue
        seconds, held = time.perf_counter() - start, _delta(resident_gb(), held)
        for n in names:
            row.update({f"{n}_first_s": round(seconds, 1), f"{n}_held_gb": held})
            row[f"{n}_cosine"] = round(cosine(outputs[n], expected), 5)
            fns[n] = calls[n]


def _add_ours(run: Run, row: dict, fns: dict, inputs, calibration, expected) -> None:
    from embedl_dynamo.precision import get_precision

    for precision in (p for p in OURS if p not in run.skip):
        options = {"precision": precision, "runtime": "auto", "cache_dir": run.workdir}
        if get_precision(precision).calibrates:
            options["calibration_data"] = calibration
        if run.budget is not None and get_precision(precision).lower:
            options["accuracy_budget"] = run.budget
        held = resident_gb()
        try:
            ours = compile_ours(run.model, inputs, options, run.backend)
        except Exception as exc:  # our failure too is a cell, not the row
            row[f"{precision}_error"] = one_line(exc)
            continue
        row[f"{precision}_held_gb"] = _delta(resident_gb(), held)
        row[f"{precision}_first_s"] = round(ours.first_s, 1)
        row[f"{precision}_cosine"] = round(cosine(ours.output, expected), 5)
        row[f"{precision}_where"] = ", ".join(sorted({s.runtime for s in ours.report.subgraphs}))
        if get_precision(precision).quantizes:
            row[f"{precision}_int8_layers"] = int8_layer_fraction(ours.report)
        fns[precision] = ours.call


def bench_row(run: Run, batch: int) -> dict:
    """One model at one batch size: every variant built, called once, then timed together."""
    torch.manual_seed(batch)
    inputs = batched(run.example, batch)
    calibration = calibration_batches(inputs)
    with torch.no_grad():
        expected = first_tensor(run.model(*inputs))
    row: dict = {"model": run.name, "family": run.family, "batch": batch}
    fns: dict[str, Call] = {"eager": lambda: run.model(*inputs)}
    try:
        _add_peers(run, row, fns, inputs, calibration, expected)
        _add_ours(run, row, fns, inputs, calibration, expected)
        row["resident_gb"] = resident_gb()  # after a gc: rejected candidates are gone
        medians = round_robin_medians(fns, run.rounds)
    finally:
        fns.clear()  # this row's runtimes go before the next row is built
        torch._dynamo.reset()
        gc.collect()
    row["eager_ms"] = round(medians["eager"] * 1e3, 2)
    for variant, seconds in medians.items():
        if variant != "eager":
            row[f"{variant}_x_eager"] = round(seconds / medians["eager"], 3)
    row.update(summarize(row))
    return row


def bench_model(
    name: str,
    batches: Sequence[int],
    rounds: int,
    backend: str,
    skip,
    budget: float | None = None,
) -> list[dict]:
    """The rows of one model, one per batch size (the model is built once, then freed)."""
    family, build = {**ZOO, **SMOKE_ZOO}[name]
    torch.manual_seed(0)
    try:
        model, example = build()
    except Exception as exc:  # a model that does not build is a row, not the end of the run
        return [{"model": name, "batch": b, "error": one_line(exc)} for b in batches]
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"embedl_bench_table_{name}_") as workdir:
        run = Run(name, family, model, example, workdir, backend, rounds, skip, budget)
        for batch in batches:
            try:
                rows.append(bench_row(run, batch))
            except Exception as exc:  # eager itself failing, or the timing loop
                rows.append({"model": name, "batch": batch, "error": one_line(exc)})
            print(json.dumps(rows[-1]), flush=True)
        del run, model
    gc.collect()
    return rows


def _ratio(value: float, against: str) -> dict:
    return {"ratio": round(value, 3), "against": against, "noise": abs(value - 1.0) <= NOISE}


def summarize(row: dict) -> dict:
    """The summary columns of a timed row: ours / best peer at each precision and mixed / the
    best of our single precisions, each as ``{"ratio", "against", "noise"}`` or a reason."""
    summary: dict = {}
    for precision, peers in PEERS_OF.items():
        ran = [p for p in peers if f"{p}_x_eager" in row]
        if f"{precision}_x_eager" not in row:
            summary[f"{precision}_vs_peer"] = f"ours {precision} did not run"
        elif not ran:
            summary[f"{precision}_vs_peer"] = "no peer ran"
        else:
            best = min(ran, key=lambda p: row[f"{p}_x_eager"])
            value = row[f"{precision}_x_eager"] / row[f"{best}_x_eager"]
            summary[f"{precision}_vs_peer"] = _ratio(value, LABELS[best])
    singles = [p for p in ("fp32", "bf16", "int8") if f"{p}_x_eager" in row]
    if "mixed_x_eager" in row and singles:
        best = min(singles, key=lambda p: row[f"{p}_x_eager"])
        summary["mixed_vs_ours"] = _ratio(row["mixed_x_eager"] / row[f"{best}_x_eager"], best)
    else:
        summary["mixed_vs_ours"] = "mixed or our single precisions did not run"
    return summary


def _cell(row: dict, variant: str, key: str) -> str:
    if f"{variant}_{key}" in row:
        return str(row[f"{variant}_{key}"])
    if f"{variant}_error" in row:
        return f"fails: {row[f'{variant}_error'][:60]}"
    return "-"


def _summary_cell(value) -> str:
    if isinstance(value, str):
        return value
    text = f"{value['ratio']:.2f} vs {value['against']}"
    return f"{text}, within noise" if value["noise"] else text


def table(rows: list[dict]) -> str:
    """The rows as Markdown: time / eager, cosine to eager, and the summary."""
    variants = (*PEERS, *OURS)
    names = " | ".join(LABELS[v] for v in variants)
    out = []
    for title, key, eager in (
        ("time / eager (lower is faster)", "x_eager", " eager ms |"),
        ("cosine to eager", "cosine", ""),
    ):
        out += [f"\n{title}:\n", f"| model | batch |{eager} {names} |",
                "|" + "---|" * (2 + bool(eager) + len(variants))]  # fmt: skip
        for r in rows:
            cells = [_cell(r, v, key) for v in variants] if "error" not in r else [r["error"]]
            ms = f" {r.get('eager_ms', '-')} |" if eager else ""
            out.append(f"| {r['model']} | {r['batch']} |{ms} " + " | ".join(cells) + " |")
    out += [
        "\nours / best peer at the same precision (within noise: within 3% of 1.0):\n",
        "| model | batch | fp32 | bf16 | int8 | mixed / OpenVINO default | mixed / best of ours | "
        "ours runs on (fp32; bf16; int8; mixed) | INT8 layers (int8; mixed) | "
        "first call s (fp32/bf16/int8/mixed; inductor) | "
        "GB held (fp32/bf16/int8/mixed; process at timing) |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | {r['batch']} | error: {r['error']} |" + " |" * 8)
            continue
        summary = [_summary_cell(r[f"{p}_vs_peer"]) for p in OURS]
        where = "; ".join(r.get(f"{p}_where", "-") for p in OURS)
        layers = "; ".join(r.get(f"{p}_int8_layers", "-") for p in ("int8", "mixed"))
        first = "/".join(str(r.get(f"{p}_first_s", "-")) for p in OURS)
        held = "/".join(str(r.get(f"{p}_held_gb", "-")) for p in OURS)
        out.append(
            f"| {r['model']} | {r['batch']} | " + " | ".join(summary)
            + f" | {_summary_cell(r['mixed_vs_ours'])} | {where} | {layers} | "
            f"{first}; {r.get('inductor_first_s', '-')} | {held}; {r.get('resident_gb')} |"
        )  # fmt: skip
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo names")
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", default="embedl_tensorrt", help="our dynamo backend")
    parser.add_argument("--skip", default="", help=f"variants to leave out: {', '.join(LABELS)}")
    parser.add_argument("--smoke", action="store_true", help="tiny_cnn, batch 1, 2 rounds")
    parser.add_argument("--json", help="also write the rows as JSON")
    parser.add_argument(
        "--accuracy-budget", type=float, default=None,
        help="our accuracy_budget (cosine to float; the library's default when left out): "
        "random-weight CNNs on 4 random calibration batches reach only about the peers' cosines",
    )  # fmt: skip
    parser.add_argument(
        "--dict-tag-guards", action="store_true",
        help="set torch._dynamo.config.use_recursive_dict_tags_for_guards (every torch.compile "
        "variant): Dynamo then skips the guards of a module tree whose dicts did not change",
    )  # fmt: skip
    args = parser.parse_args()
    torch._dynamo.config.use_recursive_dict_tags_for_guards = args.dict_tag_guards
    if args.smoke:
        args.models, args.batch, args.rounds = "tiny_cnn", "1", 2
    skip = set(filter(None, args.skip.split(",")))
    models = args.models.split(",")
    if unknown := [m for m in models if m not in {**ZOO, **SMOKE_ZOO}]:
        parser.error(f"--models {','.join(unknown)}: not in bench/zoo.py")
    if unknown := skip - set(LABELS):
        parser.error(
            f"--skip {','.join(sorted(unknown))}: not a variant; one of {', '.join(LABELS)}"
        )
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch.split(",")]
    rows = []
    for name in models:
        rows += bench_model(name, batches, args.rounds, args.backend, skip, args.accuracy_budget)
        if args.json:  # after each model: a long run that stops keeps what it measured
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
