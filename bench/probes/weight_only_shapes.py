"""Whether a runtime's int4 weight-only matmul at batch 1 is limited by memory or by its kernel,
shape by shape.

For each of a Qwen2.5-0.5B-shaped decoder layer's merged matmuls (q|k|v ``896x1152``, o
``896x896``, gate|up ``896x9728``, down ``4864x896``), two ONNX files of independent copies of
that matmul (int4 codes blocked along K by 128 -> ``DequantizeLinear`` -> ``MatMul``, as our
files store them, :func:`bench.probes.weight_only_kernels.chain_model`'s weights), all reading one
``[1, 1, K]`` token:

* **cached**: about ``--cached-mb`` of weights in all, which a run after the first reads from the
  CPU's cache;
* **streamed**: about ``--streamed-mb``, far more than the cache, so each run reads its weights
  from memory, as a decode step does.

ONNX Runtime runs them as this package builds its sessions (``MatMulNBits``, int8 compute) and
OpenVINO as its compressed ``FullyConnected``. Printed per shape and runtime: microseconds per
matmul and the weight bytes per second, cached and streamed, beside the read bandwidth a large
``sum`` reaches (:func:`bench.harness.bandwidth.read_bandwidth_gbs`). A shape whose cached rate
is not far above its streamed one is limited by the kernel, not by memory. Each file's runs are
timed by the one timer: ``--rounds`` rounds of 2 warm-up and 10 timed calls.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import interleaved
from bench.probes.weight_only_kernels import (
    BLOCK,
    HIDDEN,
    INTERMEDIATE,
    KV,
    weight_initializers,
)

__all__ = ["BASELINE", "SHAPES", "arguments", "copies_model", "run", "smoke", "table"]

BASELINE = None
SHAPES = {
    "q|k|v": (HIDDEN, HIDDEN + 2 * KV),
    "o": (HIDDEN, HIDDEN),
    "gate|up": (HIDDEN, 2 * INTERMEDIATE),
    "down": (INTERMEDIATE, HIDDEN),
}


def copies_model(k: int, n: int, copies: int, path: Path) -> None:
    """Write ``copies`` independent int4 ``[K, N]`` weight-only matmuls of one input."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nodes, initializers, outputs = [], [], []
    for c in range(copies):
        name = f"m{c}"
        initializers.extend(weight_initializers(name, k, n, 4, rng))
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [name + "_q", name + "_s", name + "_z"],
                [name + "_w"],
                axis=0,
                block_size=BLOCK,
            )
        )
        nodes.append(helper.make_node("MatMul", ["x", name + "_w"], [name]))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 1, n]))
    graph = helper.make_graph(
        nodes,
        "copies",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])],
        outputs,
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = onnx.IR_VERSION_2024_3_25
    onnx.save(model, str(path))


def _runs(path: Path, k: int) -> dict:
    from embedl_dynamo.runtimes.onnxruntime.session import create_session
    from embedl_dynamo.runtimes.openvino.compile import compile_openvino

    x = np.random.default_rng(1).random((1, 1, k), dtype=np.float32)
    session = create_session(path, ["CPUExecutionProvider"], num_threads=2)
    request = compile_openvino(path, num_threads=2).create_infer_request()
    return {
        "onnxruntime": lambda: session.run(None, {"x": x}),
        "openvino": lambda: request.infer([x]),
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--cached-mb", type=float, default=32.0)
    parser.add_argument("--streamed-mb", type=float, default=800.0)
    parser.add_argument("--rounds", type=int, default=5)


def smoke(args: argparse.Namespace) -> None:
    """Small files, one round."""
    args.cached_mb, args.streamed_mb, args.rounds = 1.0, 4.0, 1


def run(args: argparse.Namespace, record: Record) -> None:
    """Each shape: the cached and the streamed file on both runtimes."""
    from bench.harness.bandwidth import read_bandwidth_gbs

    record.extra["bandwidth_gbs"] = read_bandwidth_gbs()
    with tempfile.TemporaryDirectory(prefix="embedl-wo-shapes-") as folder:
        for label, (k, n) in SHAPES.items():
            megabytes = k * n / 2 / 1e6
            for size, kind in ((args.cached_mb, "cached"), (args.streamed_mb, "streamed")):
                copies = max(1, round(size / megabytes))
                path = Path(folder) / f"{label.replace('|', '_')}_{copies}.onnx"
                copies_model(k, n, copies, path)
                runs = _runs(path, k)
                timings = interleaved(runs, args.rounds, warmup=2, repeat=10)
                for name in runs:
                    seconds = timings.median(name) / copies
                    shape = f"{label} {k}x{n}"
                    record.add(shape, name, f"{kind}_us", seconds * 1e6, "us")
                    record.add(shape, name, f"{kind}_gbs", megabytes / seconds / 1e3, "GB/s")
                path.unlink()


def table(record: Record, view: str = "main") -> str:
    """A line per shape and runtime: cached and streamed, us per matmul and GB/s."""
    return by_metric(record, ("cached_us", "cached_gbs", "streamed_us", "streamed_gbs"))
