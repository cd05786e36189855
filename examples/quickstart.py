"""Quickstart: a ResNet-50 through ``torch.compile(model, backend="embedl_tensorrt")``.

Prints what the backend did (the transformation plan: every fusion, applied or skipped and why),
then compares the compiled model with eager PyTorch: output difference and median latency.
On this CPU the compiled graph runs on ONNX Runtime; on an NVIDIA machine, on TensorRT.

    python examples/quickstart.py            # ResNet-50, 224x224
    python examples/quickstart.py --small    # one block per stage, 64x64 (seconds)
"""

from __future__ import annotations

import argparse

import torch
from _common import resnet

import embedl_dynamo
from embedl_dynamo.deploy.benchmark import format_table, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a small ResNet and 64x64 inputs")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    size = 64 if args.small else 224
    model = resnet(args.small)
    x = torch.randn(args.batch, 3, size, size)

    embedl_dynamo.report.clear_reports()
    compiled = torch.compile(model, backend="embedl_tensorrt")
    with torch.no_grad():
        expected, got = model(x), compiled(x)  # the first compiled call builds the artifact

    report = embedl_dynamo.last_report()
    print(report)
    for sub in report:
        if sub.plan is not None:
            print(sub.plan)
    diff = float((got - expected).abs().max())
    agree = bool((got.argmax(1) == expected.argmax(1)).all())
    print(f"\nmax abs diff vs eager: {diff:.2e} (outputs up to {float(expected.abs().max()):.2f}); "
          f"same top-1: {agree}")  # fmt: skip

    rows = [
        measure("eager", model, (x,), repeats=args.repeats),
        measure("embedl_tensorrt", compiled, (x,), repeats=args.repeats),
    ]
    print(f"\nbatch {args.batch}, {size}x{size}, {torch.get_num_threads()} threads:")
    print(format_table(rows, baseline="eager"))
    if diff > 1e-3 * max(1.0, float(expected.abs().max())):
        raise SystemExit(f"compiled output differs from eager by {diff:.2e}")


if __name__ == "__main__":
    main()
