"""Whether a runtime's int4 weight-only matmul at batch 1 is limited by memory or by its kernel,
shape by shape.

For each of a Qwen2.5-0.5B-shaped decoder layer's merged matmuls (q|k|v ``896x1152``, o
``896x896``, gate|up ``896x9728``, down ``4864x896``), two ONNX files of independent copies of
that matmul (int4 codes blocked along K by 128 -> ``DequantizeLinear`` -> ``MatMul``, as our
files store them, :func:`bench.weight_only_kernels.chain_model`'s weights), all reading one
``[1, 1, K]`` token:

* **cached**: about ``--cached-mb`` of weights in all, which a run after the first reads from the
  CPU's cache;
* **streamed**: about ``--streamed-mb``, far more than the cache, so each run reads its weights
  from memory, as a decode step does.

ONNX Runtime runs them as this package builds its sessions (``MatMulNBits``, int8 compute) and
OpenVINO as its compressed ``FullyConnected``. Printed per shape and runtime: microseconds per
matmul and the weight bytes per second, cached and streamed, beside the read bandwidth a large
``sum`` reaches (:func:`bench.bench_llm.read_bandwidth_gbs`). A shape whose cached rate is not
far above its streamed one is limited by the kernel, not by memory.

Usage: ``python -m bench.weight_only_shapes [--cached-mb 32] [--streamed-mb 800] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from bench.weight_only_kernels import (
    BLOCK,
    HIDDEN,
    INTERMEDIATE,
    KV,
    round_median,
    weight_initializers,
)

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
        nodes.append(helper.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"],
                                      [name + "_w"], axis=0, block_size=BLOCK))  # fmt: skip
        nodes.append(helper.make_node("MatMul", ["x", name + "_w"], [name]))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 1, n]))
    graph = helper.make_graph(
        nodes, "copies", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])],
        outputs, initializers,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = onnx.IR_VERSION_2024_3_25
    onnx.save(model, str(path))


def _runs(path: Path, k: int) -> dict:
    from embedl_dynamo.runtimes.onnxruntime.session import create_session
    from embedl_dynamo.runtimes.openvino.compile import compile_openvino

    x = np.random.default_rng(1).random((1, 1, k), dtype=np.float32)
    session = create_session(path, ["CPUExecutionProvider"], num_threads=2)
    request = compile_openvino(path, num_threads=2).create_infer_request()
    return {"onnxruntime": lambda: session.run(None, {"x": x}),
            "openvino": lambda: request.infer([x])}  # fmt: skip


def _median_seconds(run, rounds: int) -> float:
    return statistics.median(round_median(run, warmup=2, samples=10) for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cached-mb", type=float, default=32.0)
    parser.add_argument("--streamed-mb", type=float, default=800.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from bench.bench_llm import read_bandwidth_gbs

    print(f"read bandwidth {read_bandwidth_gbs():.1f} GB/s (a large sum, 2 threads)")
    print("| shape | runtime | cached us | cached GB/s | streamed us | streamed GB/s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="embedl-wo-shapes-") as folder:
        for label, (k, n) in SHAPES.items():
            megabytes = k * n / 2 / 1e6
            rows: dict[str, list[float]] = {}
            for size in (args.cached_mb, args.streamed_mb):
                copies = max(1, round(size / megabytes))
                path = Path(folder) / f"{label.replace('|', '_')}_{copies}.onnx"
                copies_model(k, n, copies, path)
                for name, run in _runs(path, k).items():
                    rows.setdefault(name, []).append(_median_seconds(run, args.rounds) / copies)
                path.unlink()
            for name, (cached, streamed) in rows.items():
                print(f"| {label} {k}x{n} | {name} | {cached * 1e6:.1f} | "
                      f"{megabytes / cached / 1e3:.1f} | {streamed * 1e6:.1f} | "
                      f"{megabytes / streamed / 1e3:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
