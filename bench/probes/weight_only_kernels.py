"""How fast each CPU runtime's weight-only kernels stream a decoder's weights at batch 1.

A chain of the linears of ``--layers`` Qwen2.5-0.5B-shaped decoder layers (q, k, v, o, gate,
up, down: hidden 896, intermediate 4864, two key/value heads of 128), each written as our ONNX
file writes a weight-only linear (integer codes -> ``DequantizeLinear`` -> ``MatMul``; int4
blocked along K by 128 at opset 21, int8 per output channel), with weights of their own
(colder than any cache), run on one ``[1, 1, 896]`` token by ONNX Runtime (``MatMulNBits``, our
session options) and OpenVINO (compressed ``FullyConnected``), interleaved in rounds. With
``--merged`` the linears that read one input are one weight each, as our files store them
(:mod:`embedl_dynamo.quant.weight_only.merge`): q|k|v ``[896, 1152]`` and gate|up ``[896,
9728]``, four matmuls a layer instead of seven. ``torch`` runs the same chain
on PyTorch's own CPU weight-only kernels (``_weight_int4pack_mm_for_cpu``,
``_weight_int8pack_mm``), the eager runtime's candidates. Rows: each runner's median ms per
chain (``--rounds`` rounds of the one timer, 3 warm-up and 15 timed calls each; the
round medians in the row's info) and the weight bytes streamed per second.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from bench.harness.record import Record
from bench.harness.table import by_metric
from bench.harness.timer import interleaved

__all__ = [
    "BASELINE",
    "BLOCK",
    "arguments",
    "chain_model",
    "run",
    "smoke",
    "table",
    "weight_initializers",
]

BASELINE = None

HIDDEN, INTERMEDIATE, KV = 896, 4864, 128
BLOCK = 128


def weight_initializers(name: str, k: int, n: int, bits: int, rng: np.random.Generator) -> list:
    """Codes, scales and zero points of one ``[K, N]`` weight, as our writer stores them."""
    from onnx import TensorProto, numpy_helper

    if bits == 8:
        return [
            numpy_helper.from_array(rng.integers(0, 255, (k, n), dtype=np.uint8), name + "_q"),
            numpy_helper.from_array((rng.random(n) * 1e-3).astype(np.float32), name + "_s"),
            numpy_helper.from_array(np.full(n, 128, np.uint8), name + "_z"),
        ]
    codes = rng.integers(0, 16, (k, n), dtype=np.uint8).reshape(-1, 2)
    q = numpy_helper.from_array(np.zeros((k, n), np.uint8), name + "_q")
    q.data_type, q.raw_data = TensorProto.UINT4, (codes[:, 0] | codes[:, 1] << 4).tobytes()
    z = numpy_helper.from_array(np.zeros((k // BLOCK, n), np.uint8), name + "_z")
    z.data_type, z.raw_data = (
        TensorProto.UINT4,
        np.full(k // BLOCK * n // 2, 0x88, np.uint8).tobytes(),
    )
    scale = (rng.random((k // BLOCK, n)) * 1e-3).astype(np.float32)
    return [q, numpy_helper.from_array(scale, name + "_s"), z]


def chain_model(layers: int, bits: int, path: Path, merged: bool = False) -> None:
    """Write the chain of ``layers`` decoder layers' weight-only linears to ``path``; with
    ``merged``, siblings of one input as one weight (q|k|v, gate|up)."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nodes, initializers = [], []

    def linear(x: str, k: int, n: int, name: str) -> str:
        initializers.extend(weight_initializers(name, k, n, bits, rng))
        attrs = {"axis": 0, "block_size": BLOCK} if bits == 4 else {"axis": 1}
        nodes.append(
            helper.make_node(
                "DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name + "_w"], **attrs
            )
        )
        nodes.append(helper.make_node("MatMul", [x, name + "_w"], [name]))
        return name

    def split(x: str, sizes: list[int], name: str) -> list[str]:
        initializers.append(
            helper.make_tensor(name + "_sizes", TensorProto.INT64, [len(sizes)], sizes)
        )
        outputs = [f"{name}.{j}" for j in range(len(sizes))]
        nodes.append(helper.make_node("Split", [x, name + "_sizes"], outputs, axis=-1))
        return outputs

    x = "x"
    for i in range(layers):
        if merged:
            q = split(
                linear(x, HIDDEN, HIDDEN + 2 * KV, f"l{i}.qkv"), [HIDDEN, KV, KV], f"l{i}.qkv_s"
            )[0]
        else:
            q = linear(x, HIDDEN, HIDDEN, f"l{i}.q")
            linear(x, HIDDEN, KV, f"l{i}.k")
            linear(x, HIDDEN, KV, f"l{i}.v")
        o = linear(q, HIDDEN, HIDDEN, f"l{i}.o")
        if merged:
            both = linear(o, HIDDEN, 2 * INTERMEDIATE, f"l{i}.gate_up")
            gate, up = split(both, [INTERMEDIATE, INTERMEDIATE], f"l{i}.gate_up_s")
        else:
            gate, up = (
                linear(o, HIDDEN, INTERMEDIATE, f"l{i}.gate"),
                linear(o, HIDDEN, INTERMEDIATE, f"l{i}.up"),
            )
        nodes.append(helper.make_node("Mul", [gate, up], [f"l{i}.mlp"]))
        x = linear(f"l{i}.mlp", INTERMEDIATE, HIDDEN, f"l{i}.down")
    token = [1, 1, HIDDEN]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, token)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, token)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = onnx.IR_VERSION_2024_3_25
    onnx.save(model, str(path))


def torch_chain(layers: int, bits: int, merged: bool = False):
    """The same chain on the weight-only kernels PyTorch ships for CPUs
    (``aten._weight_int4pack_mm_for_cpu``, groups of :data:`BLOCK`, and
    ``aten._weight_int8pack_mm``, per output channel), as ``run()``."""
    import torch

    generator = torch.Generator().manual_seed(0)

    def weight(k: int, n: int):
        if bits == 8:
            codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=generator)
            scales = torch.rand(n, generator=generator) * 1e-3
            return lambda x: torch.ops.aten._weight_int8pack_mm(x, codes, scales)
        codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=generator)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        scales_zeros = torch.rand(k // BLOCK, n, 2, generator=generator) * 1e-3
        return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, BLOCK, scales_zeros)

    steps = []
    for _ in range(layers):
        if merged:
            steps.append(
                (
                    weight(HIDDEN, HIDDEN + 2 * KV),
                    weight(HIDDEN, HIDDEN),
                    weight(HIDDEN, 2 * INTERMEDIATE),
                    weight(INTERMEDIATE, HIDDEN),
                )
            )
        else:
            steps.append(
                tuple(weight(HIDDEN, n) for n in (HIDDEN, KV, KV, HIDDEN))
                + tuple(weight(HIDDEN, INTERMEDIATE) for _ in range(2))
                + (weight(INTERMEDIATE, HIDDEN),)
            )
    x = torch.rand(1, HIDDEN, generator=generator)

    def run():
        with torch.no_grad():
            h = x
            for step in steps:
                if merged:
                    q = step[0](h)[:, :HIDDEN]
                    both = step[2](step[1](q.contiguous()))
                    h = step[3](both[:, :INTERMEDIATE] * both[:, INTERMEDIATE:])
                else:
                    q = step[0](h)
                    step[1](h), step[2](h)
                    o = step[3](q)
                    h = step[6](step[4](o) * step[5](o))
            return h

    return run


def runners(path: Path, group_sizes: list[int]) -> dict:
    """``{runtime: run()}`` over the file, each built as this package builds its sessions;
    OpenVINO also with each of ``group_sizes`` as its ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` (the
    activations quantized to int8 in groups of that many, for its VNNI/AMX kernels)."""
    from embedl_dynamo.runtimes.onnxruntime.session import create_session
    from embedl_dynamo.runtimes.openvino.compile import compile_openvino

    x = np.random.default_rng(1).random((1, 1, HIDDEN), dtype=np.float32)
    session = create_session(path, ["CPUExecutionProvider"], num_threads=2)
    request = compile_openvino(path, num_threads=2).create_infer_request()
    runs = {
        "onnxruntime": lambda: session.run(None, {"x": x}),
        "openvino": lambda: request.infer([x]),
    }
    for size in group_sizes:
        config = {"DYNAMIC_QUANTIZATION_GROUP_SIZE": size}
        grouped = compile_openvino(path, num_threads=2, config=config).create_infer_request()
        runs[f"openvino group {size}"] = lambda r=grouped: r.infer([x])
    return runs


def arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's options."""
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--merged", action="store_true", help="q|k|v and gate|up as one weight")
    parser.add_argument(
        "--ov-group-sizes",
        type=int,
        nargs="*",
        default=[],
        help="also OpenVINO with these DYNAMIC_QUANTIZATION_GROUP_SIZE values",
    )


def smoke(args: argparse.Namespace) -> None:
    """One layer, int4, one round."""
    args.layers, args.bits, args.rounds = 1, [4], 1


def run(args: argparse.Namespace, record: Record) -> None:
    """Each bit width: the chain on every runner, interleaved in rounds."""
    linear_weights = HIDDEN * (2 * HIDDEN + 2 * KV + 3 * INTERMEDIATE) * args.layers
    params = {"layers": args.layers, "merged": args.merged}
    with tempfile.TemporaryDirectory(prefix="embedl-wo-kernels-") as folder:
        for bits in args.bits:
            path = Path(folder) / f"chain{bits}.onnx"
            chain_model(args.layers, bits, path, args.merged)
            runs = runners(path, args.ov_group_sizes)
            runs["torch"] = torch_chain(args.layers, bits, args.merged)
            timings = interleaved(runs, args.rounds, warmup=3, repeat=15)
            gigabytes = linear_weights * bits / 8 / 1e9
            for name in runs:
                ms = timings.median(name) * 1e3
                info = {"round_ms": [round(t * 1e3, 3) for t in timings.round_medians(name)]}
                record.add(f"int{bits} chain", name, "chain", ms, "ms", params=params, info=info)
                record.add(
                    f"int{bits} chain",
                    name,
                    "streamed",
                    gigabytes / ms * 1e3,
                    "GB/s",
                    params=params,
                )


def table(record: Record, view: str = "main") -> str:
    """A line per bit width and runner: ms per chain and GB/s of weights."""
    return by_metric(record, ("chain", "streamed"))
