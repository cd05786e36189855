"""Quickstart: a ResNet-50 through ``torch.compile(model, backend="embedl_tensorrt")``.

Prints one screen: where the compiled graph ran and what was rewritten, then the compiled
model against eager PyTorch: output agreement and median latency. On this CPU the compiled
graph runs on ONNX Runtime; on an NVIDIA machine, on TensorRT.

    python examples/quickstart.py            # ResNet-50, 224x224
    python examples/quickstart.py --small    # one block per stage, 64x64 (seconds)
    python examples/quickstart.py --plan     # also the full plan: every match and why
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
    parser.add_argument("--plan", action="store_true", help="print the full transformation plan")
    args = parser.parse_args()

    size = 64 if args.small else 224
    model = resnet(args.small)
    x = torch.randn(args.batch, 3, size, size)

    embedl_dynamo.clear_reports()
    compiled = torch.compile(model, backend="embedl_tensorrt")
    with torch.no_grad():
        expected, got = model(x), compiled(x)  # the first compiled call builds the artifact

    report = embedl_dynamo.last_report()
    print(report)
    if args.plan:
        for sub in report:
            if sub.plan is not None:
                print(sub.plan)
    diff = float((got - expected).abs().max())
    agree = bool((got.argmax(1) == expected.argmax(1)).all())
    print(
        f"output: max abs diff {diff:.2e} vs eager (outputs up to "
        f"{float(expected.abs().max()):.2f}); same top-1: {agree}"
    )

    rows = [
        measure("eager", model, (x,), repeats=args.repeats),
        measure("embedl_tensorrt", compiled, (x,), repeats=args.repeats),
    ]
    print(f"latency, batch {args.batch}, {size}x{size}, {torch.get_num_threads()} threads:")
    print(format_table(rows, baseline="eager"))
    if diff > 1e-3 * max(1.0, float(expected.abs().max())):
        raise SystemExit(f"compiled output differs from eager by {diff:.2e}")


if __name__ == "__main__":
    main()
