"""Use the installed ExampleAccel plug-in exactly like a built-in target.

pip install ./examples/third_party_backend
python examples/third_party_backend/demo.py
"""

from __future__ import annotations

import torch
from torch import nn

model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1),
    nn.BatchNorm2d(16),
    nn.ReLU(),
    nn.Conv2d(16, 16, 3, padding=1),
    nn.BatchNorm2d(16),
).eval()
x = torch.randn(2, 3, 32, 32)

print("dynamo backends:", [b for b in torch._dynamo.list_backends() if "exampleaccel" in b])
compiled = torch.compile(model, backend="embedl_exampleaccel")  # found through the entry point
with torch.no_grad():
    diff = float((compiled(x) - model(x)).abs().max())

import embedl_dynamo  # noqa: E402  (only to show the report; compiling did not need it)

print("discovered targets:", sorted(embedl_dynamo.discover_backends()))
report = embedl_dynamo.last_report()
print(report)
print(report[0].plan)
print(f"max abs diff to eager: {diff:.2e}")
