"""Save a compiled model once, start it in a fresh process without Dynamo's trace.

``embedl_dynamo.save_compiled`` compiles the model's forward through PyTorch's ``aot_compile``
and saves it (PyTorch's file: load only files you made), with ``bundle=True`` the artifacts it
loads beside it. A second process, started here, builds the same model (same weights), calls
``embedl_dynamo.load_compiled`` and runs it under ``torch.no_grad()``: no trace, no pipeline
stage, every artifact loaded from the bundle.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import embedl_dynamo


def build_model(width: int) -> nn.Module:
    """A small CNN with fixed weights: the loading process builds the same one."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, 10),
    )
    return model.eval()


def load(folder: Path, width: int) -> None:
    """The fresh process: load, call once, print the result as JSON."""
    model = build_model(width)
    x = torch.load(folder / "input.pt")
    start = time.perf_counter()
    fn = embedl_dynamo.load_compiled(folder / "model.pt", model)
    with torch.no_grad():
        y = fn(x)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "loaded": fn.report.loaded, "output": y.tolist()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--int8", action="store_true", help="INT8, calibrated on 4 batches")
    parser.add_argument("--out", help="directory for the files (a temporary one by default)")
    parser.add_argument("--load", help=argparse.SUPPRESS)  # the fresh process
    args = parser.parse_args()
    width = 8 if args.small else 32
    if args.load:
        return load(Path(args.load), width)

    folder = Path(args.out or tempfile.mkdtemp(prefix="embedl_saved_"))
    model = build_model(width)
    x = torch.randn(2, 3, 32, 32)
    options = {}
    if args.int8:
        batches = [(torch.randn(2, 3, 32, 32),) for _ in range(4)]
        options = {"precision": "int8", "calibration_data": batches, "accuracy_budget": 0.9}
    compiled = embedl_dynamo.save_compiled(
        model, x, folder / "model.pt", backend="embedl_onnxruntime", bundle=True, **options
    )
    torch.save(x, folder / "input.pt")
    with torch.no_grad():
        expected = compiled(x)
    print(f"saved {folder / 'model.pt'} and its artifacts in {folder / 'model.pt.artifacts'}")

    child = subprocess.run(
        [sys.executable, __file__, "--load", str(folder), *(["--small"] if args.small else [])],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result = json.loads(child.stdout.splitlines()[-1])
    diff = float((torch.tensor(result["output"]) - expected).abs().max())
    print(
        f"fresh process: first output {result['seconds']:.2f} s after load_compiled, "
        f"{result['loaded'] or 'built'}"
    )
    print(f"max abs diff to the saving process: {diff:.2e}")


if __name__ == "__main__":
    main()
