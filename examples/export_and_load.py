"""Ahead-of-time export and load: a file you can ship, and the module you get back.

``embedl_dynamo.export`` runs the same pipeline as the ``torch.compile`` backend (fusions, and
INT8 QDQ with ``--int8``), writes ``model.onnx`` plus a JSON sidecar (plan, scales, versions,
the verified max difference), and ``embedl_dynamo.load`` runs it on the best runtime here,
torch tensors in and out, at any batch size.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from _common import resnet

import embedl_dynamo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--int8", action="store_true", help="INT8 QDQ export")
    parser.add_argument("--out", help="directory for the files (a temporary one by default)")
    args = parser.parse_args()

    size = 64 if args.small else 224
    model = resnet(args.small)
    x = torch.randn(2, 3, size, size)
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="embedl_export_"))
    calibration = [torch.randn(4, 3, size, size) for _ in range(4)] if args.int8 else None

    path = embedl_dynamo.export(
        model,
        (x,),
        out_dir / "resnet.onnx",
        backend="onnxruntime" if args.int8 else "tensorrt",
        quantize="int8" if args.int8 else None,
        calibration_data=calibration,
    )
    side = json.loads(path.with_suffix(".json").read_text())
    check = side["verification"]
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) and {path.with_suffix('.json').name}")
    print(
        f"  plan: {side['plan']['applied_count']} applied, {side['plan']['skipped_count']} skipped"
    )
    print(f"  verified: max abs diff {check['max_abs_diff']:.2e} vs {check['compared_with']}")
    if side["quantized"]:
        print(
            f"  INT8: {len(side['quantization']['scales'] or {})} scales, "
            f"{len(side['quantization']['float_layers'])} layers left in float"
        )

    loaded = embedl_dynamo.load(path)
    print(f"loaded: {loaded}")
    for batch in (1, 5):
        xb = torch.randn(batch, 3, size, size)
        with torch.no_grad():
            want = model(xb)
        got = loaded(xb)
        print(
            f"  batch {batch}: output {tuple(got.shape)}, max abs diff to eager "
            f"{float((got - want).abs().max()):.2e}"
        )


if __name__ == "__main__":
    main()
