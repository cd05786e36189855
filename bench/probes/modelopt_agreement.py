"""Where our ``tensorrt`` INT8 (or FP8) export puts Q/DQ, against NVIDIA ModelOpt's ONNX placement.

For each model (random weights, batch 1, static shapes):

1. our float file: ``embedl_dynamo.export(..., backend="tensorrt", precision="fp32")``;
2. our INT8 file: the same with ``precision="int8"`` and N random calibration batches;
3. ModelOpt's INT8 file: ``modelopt.onnx.quantization.quantize`` of *our float file* with the
   same batches (``calibration_method="max"``, CPU calibration, ``high_precision_dtype="fp32"``
   by default so both files stay float32 around the Q/DQ and only the placement differs);
   With ``--mode fp8`` steps 2 and 3 are ``precision="fp8"`` and ModelOpt's
   ``quantize_mode="fp8"`` (E4M3FN Q/DQ) instead;
4. for every Conv, Gemm, MatMul and Add node (and any other op that reads a Q/DQ'd tensor in
   either file: Mul, pooling, LayerNorm...), which of its inputs are fed by a
   DequantizeLinear, in ours and in ModelOpt's.

An input counts as *quantized* when a DequantizeLinear reaches it through data-movement ops only
(Identity, Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Split, Slice, Cast: the ops TensorRT
moves Q/DQ across). Inputs that are constants (initialisers and what folds from them: biases, shape
arithmetic) are not counted, except the weight of Conv/Gemm/MatMul. Nodes are matched by name
(ModelOpt keeps our float file's names, and our INT8 export gives each op the float export's
name), after checking that each op type has as many nodes in all three files, with the weight
size of each matched Conv/Gemm/MatMul as a cross-check; if the names do not match, by
topological position within the op type.

Set-up (a separate venv; ModelOpt's ``[onnx]`` extra would pull onnxruntime-gpu and move onnx)::

    python3 -m venv /tmp/mo-venv && . /tmp/mo-venv/bin/activate
    pip install -q -c constraints.txt -e ".[dev,bench]"
    pip install -c constraints.txt nvidia-modelopt==0.47.0 requests onnx_graphsurgeon onnxslim polygraphy
    pip install --no-deps lief onnxconverter-common

(check each with ``--dry-run`` first: torch must stay 2.13.0+cpu and onnx / onnxruntime at the
constraints' versions.)

Rows: per model and op type (params), the agreement in percent and the input counts; the
differing node groups and the seconds of each step in the record's ``extra``. The node-by-node
analysis is :mod:`bench.probes.qdq_placement`.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import stopwatch, timed_call
from bench.models.zoo import import_model_libraries
from bench.probes.qdq_placement import Comparison, compare

__all__ = ["BASELINE", "arguments", "build_files", "run", "smoke", "table"]

BASELINE = None


def _models() -> dict[str, str]:
    """name -> (library, architecture)."""
    return {
        "resnet50": "torchvision:resnet50",
        "vit_small": "timm:vit_small_patch16_224",
        "vit_tiny": "timm:vit_tiny_patch16_224",
    }


def _build(name: str) -> torch.nn.Module:
    import_model_libraries()
    library, architecture = _models()[name].split(":")
    if library == "torchvision":
        import torchvision

        return getattr(torchvision.models, architecture)(weights=None).eval()
    import timm

    return timm.create_model(architecture, pretrained=False).eval()


def build_files(
    name: str,
    out: Path,
    n_calibration: int,
    high_precision: str,
    dq_only: bool,
    mode: str = "int8",
) -> tuple[Path, Path, Path, dict[str, float]]:
    from modelopt.onnx.quantization import quantize as modelopt_quantize

    import embedl_dynamo

    torch.manual_seed(0)
    model = _build(name)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 3, 224, 224, generator=gen)
    calibration = [torch.randn(1, 3, 224, 224, generator=gen) for _ in range(n_calibration)]
    paths = [out / f"{name}_{kind}.onnx" for kind in ("fp32", f"ours_{mode}", f"modelopt_{mode}")]
    seconds = {}
    common = dict(
        backend="tensorrt",
        verify=False,
        dynamic_batch=False,
        options={"cache_dir": str(out / "cache")},
    )
    seconds["our fp32 export"] = timed_call(
        embedl_dynamo.export, model, x, paths[0], precision="fp32", **common
    )[1]
    seconds[f"our {mode} export"] = timed_call(
        embedl_dynamo.export,
        model,
        x,
        paths[1],
        precision=mode,
        calibration_data=calibration,
        **common,
    )[1]
    seconds["ModelOpt quantize"] = timed_call(
        modelopt_quantize,
        str(paths[0]),
        quantize_mode=mode,
        calibration_data=np.concatenate([c.numpy() for c in calibration]),
        calibration_method="max",
        calibration_eps=["cpu"],
        output_path=str(paths[2]),
        high_precision_dtype=high_precision,
        dq_only=dq_only,
        log_level="CRITICAL",  # its "Failed to get GPU count" is logged as an error
    )[1]
    return *paths, seconds


def markdown(result: Comparison) -> str:
    """The comparison of one model as Markdown: counts, the agreement table, the differences."""
    lines = [
        f"### {result.model}",
        "",
        f"matched by {result.matching}; nodes per op type (float / ours / ModelOpt): "
        + ", ".join(f"{op} {'/'.join(map(str, c))}" for op, c in result.op_counts.items()),
        f"Q/DQ nodes: ours {result.qdq_counts['ours']['Q']}/{result.qdq_counts['ours']['DQ']}, "
        f"ModelOpt {result.qdq_counts['modelopt']['Q']}/{result.qdq_counts['modelopt']['DQ']}; "
        f"weights: ours {result.weights['ours']}, ModelOpt {result.weights['modelopt']}",
        "",
        "| op type | nodes | inputs quantized by both | only ours | only ModelOpt | neither "
        "| agreement % |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in [*result.rows, result.total]:
        label = "**overall**" if r is result.total else r.op
        lines.append(
            f"| {label} | {r.nodes} | {r.both} | {r.only_ours} | {r.only_modelopt} | {r.neither} "
            f"| {r.agreement:.1f} |"
        )
    lines += [
        "",
        "Differing node groups (inputs counted: activations and Conv/Gemm/MatMul "
        "weights; #i = input position, named by the op computing it):",
        "",
    ]
    if not result.differences:
        lines.append("- none")
    for d in result.differences:
        note = "".join(
            f"; {side}: DQ one op earlier on {', '.join(d[key])}"
            for side, key in (
                ("ours", "ours_dq_one_op_earlier"),
                ("ModelOpt", "modelopt_dq_one_op_earlier"),
            )
            if d[key]
        )
        lines.append(
            f"- {d['count']} x {d['kind']} [{', '.join(d['inputs'])}]: ours quantizes "
            f"{d['ours']}; ModelOpt {d['modelopt']}{note} (e.g. {', '.join(d['examples'][:2])})"
        )
    secs = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items())
    lines += ["", f"time: {secs}", ""]
    return "\n".join(lines)


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--models", default="resnet50,vit_small", help=f"of {sorted(_models())}")
    parser.add_argument("--calibration", type=int, default=4, help="random batches of 1")
    parser.add_argument(
        "--high-precision",
        choices=("fp32", "fp16"),
        default="fp32",
        help="ModelOpt's high_precision_dtype (its own default is fp16)",
    )
    parser.add_argument(
        "--mode", choices=("int8", "fp8"), default="int8", help="our precision and ModelOpt's"
    )
    parser.add_argument("--dq-only", action="store_true", help="ModelOpt: int8 weights, DQ only")
    parser.add_argument("--out-dir", help="keep the ONNX files here (default: a temp dir)")


def smoke(args: argparse.Namespace) -> None:
    """ViT-tiny, one calibration batch."""
    args.models, args.calibration = "vit_tiny", 1


def run(args: argparse.Namespace, record: Record) -> None:
    """Each model: the three files, then the comparison as rows."""
    logging.getLogger("root").setLevel(logging.ERROR)  # ModelOpt / ORT bias warnings
    with tempfile.TemporaryDirectory() as tmp_dir:
        out = Path(args.out_dir) if args.out_dir else Path(tmp_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            with stopwatch() as elapsed:
                ref, ours, mo, seconds = build_files(
                    name, out, args.calibration, args.high_precision, args.dq_only, args.mode
                )
                result = compare(name, ref, ours, mo)
            result.seconds = {**seconds, "total": elapsed()}
            print(markdown(result), flush=True)
            for row in [*result.rows, result.total]:
                params = {"mode": args.mode, "op": row.op}
                record.add(
                    name,
                    "ours vs ModelOpt",
                    "agreement",
                    row.agreement,
                    "%",
                    params=params,
                    info={
                        "nodes": row.nodes,
                        "both": row.both,
                        "only_ours": row.only_ours,
                        "only_modelopt": row.only_modelopt,
                        "neither": row.neither,
                    },
                )
            record.extra[name] = {
                "matching": result.matching,
                "differences": result.differences,
                "qdq_counts": result.qdq_counts,
                "seconds": result.seconds,
            }


def table(record: Record, view: str = "main") -> str:
    """A line per model and op type: the agreement."""
    return by_metric(record, ("agreement",))
