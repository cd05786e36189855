"""One fresh process of the warm-start tests: compiles a small CNN at fp32, int8 and mixed and an
MLP at int4 weight-only, and prints each one's outputs and reports as JSON on its last line.

Run as ``python -m tests.dynamo.warm_start_worker`` with ``EMBEDL_DYNAMO_CACHE_DIR`` set.
"""

from __future__ import annotations

import json

import torch
from torch import nn

import embedl_dynamo
from tests.models import ResNetLike

CASES = {
    "fp32": ("embedl_onnxruntime", {}),
    "int8": ("embedl_openvino", {"calibration_steps": 2}),
    "mixed": ("embedl_openvino", {"calibration_steps": 2}),
    "int4_weight_only": ("embedl_onnxruntime", {"accuracy_budget": 0.5}),
}


def _model(precision: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if precision.endswith("weight_only"):
        model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128))
        return model.eval(), torch.randn(4, 128)
    return ResNetLike().eval(), torch.randn(2, 3, 32, 32)


def main() -> None:
    results = {}
    for precision, (backend, options) in CASES.items():
        model, x = _model(precision)
        compiled = torch.compile(
            model, backend=backend, options={"precision": precision, **options}
        )
        with torch.inference_mode():
            outputs = [compiled(x * (1 + i / 10)) for i in range(3)]  # INT8 calibrates on 2
        reports = embedl_dynamo.last_report()
        results[precision] = {
            "output": outputs[-1].tolist(),
            "loaded": [r.loaded for r in reports],
            "runtime": [r.runtime for r in reports],
            "report": [str(r) for r in reports],
        }
    embedl_dynamo.wait_for_cache_writes()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
