"""INT8 speed and fidelity on ResNet-50 (random weights, synthetic calibration), in one run.

Variants, batch 1 and 8: float eager PyTorch; float ``embedl_tensorrt`` (on this CPU it runs
through its fallback runtime); INT8 ``embedl_onnxruntime``; ONNX Runtime's own
``quantize_static`` (QDQ, uint8 activations / int8 per-channel weights) on the same float model
and calibration data: the specialist to beat. Targets (issue 4): INT8 latency <= 0.25x float
eager at batch 1, <= 1.1x the specialist's, output cosine similarity to float >= 0.999.

Usage::

    python bench/bench_int8.py [--repeat 20] [--calibration 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.models import resnet50  # noqa: E402
from bench.ort_baseline import ort_quantize_static  # noqa: E402


def _interleaved_ms(variants: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median ms per variant, timed round-robin so a shared machine's load hits all alike."""
    for fn in variants.values():
        for _ in range(2):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def _specialist(model, calibration, tmp: Path):
    session = ort_quantize_static(model, calibration, tmp)
    return lambda x: torch.from_numpy(session.run(None, {"x": x.numpy()})[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--calibration", type=int, default=8, help="calibration batches of 8")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = resnet50()
    gen = torch.Generator().manual_seed(0)
    calibration = [torch.rand(8, 3, 224, 224, generator=gen) for _ in range(args.calibration)]
    inputs = {bs: torch.rand(bs, 3, 224, 224, generator=gen) for bs in (1, 8)}

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        start = time.perf_counter()
        trt = torch.compile(
            model, backend="embedl_tensorrt", options={"cache_dir": str(tmp / "c1")}
        )
        int8 = torch.compile(
            model,
            backend="embedl_onnxruntime",
            options={
                "quantize": "int8",
                "calibration_data": calibration,
                "cache_dir": str(tmp / "c2"),
            },
        )
        specialist = _specialist(model, calibration, tmp)
        with torch.no_grad():
            for x in inputs.values():  # compile / build outside the timings
                trt(x)
                int8(x)
        print(
            f"setup (compiles, calibration, ORT quantize_static): {time.perf_counter() - start:.1f} s"
        )

        rows = []
        with torch.no_grad():
            for bs, x in inputs.items():
                repeat = args.repeat if bs == 1 else max(3, args.repeat // 4)
                reference = model(x)
                variants = {
                    "float eager": lambda x=x: model(x),
                    "float embedl_tensorrt": lambda x=x: trt(x),
                    "INT8 embedl_onnxruntime": lambda x=x: int8(x),
                    "ORT quantize_static": lambda x=x: specialist(x),
                }
                times = _interleaved_ms(variants, repeat)
                cosines = {name: _cosine(fn(), reference) for name, fn in variants.items()}
                rows.append((bs, times, cosines))

    print(f"\n{'batch':>5}  {'variant':<24} {'ms':>8} {'x eager':>8} {'cos to float':>12}")
    for bs, times, cosines in rows:
        for name, ms in times.items():
            ratio = ms / times["float eager"]
            print(f"{bs:>5}  {name:<24} {ms:8.1f} {ratio:8.3f} {cosines[name]:12.5f}")
    print()
    for bs, times, cosines in rows:
        ours, eager, spec = (
            times["INT8 embedl_onnxruntime"],
            times["float eager"],
            times["ORT quantize_static"],
        )
        print(
            f"batch {bs}: INT8/eager = {ours / eager:.3f} (target <= 0.25 at bs1), "
            f"INT8/specialist = {ours / spec:.3f} (target <= 1.1), "
            f"cosine = {cosines['INT8 embedl_onnxruntime']:.5f} (target >= 0.999), "
            f"specialist cosine = {cosines['ORT quantize_static']:.5f}"
        )


if __name__ == "__main__":
    main()
