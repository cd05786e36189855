"""The fresh process of the saved-function tests: loads each compiled function the test saved and
prints, as JSON on its last line, each one's outputs, report and the error it raised, if any.

Run as ``python -m tests.dynamo.saved_worker <folder> <case>...`` with the cache the test saved
in (``EMBEDL_DYNAMO_CACHE_DIR``); each case's file is ``<folder>/<case>.pt``. The models are
built here with the seed the test used, so their weights are the saved ones.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

import embedl_dynamo
from tests.models import randomize_batchnorm


class SmallNet(nn.Module):
    """Conv, BatchNorm, ReLU, conv, ReLU, pooling, linear: a few ops, built in about a second."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)
        randomize_batchnorm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv2(torch.relu(self.bn(self.conv1(x)))))
        return self.fc(y.mean((2, 3)))


class CoshNet(nn.Module):
    """Conv, BatchNorm, ReLU; ``cosh`` (no conformance row: stays in PyTorch); conv, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.cosh(y * 0.1)
        y = torch.relu(self.conv2(y))
        return self.head(y.mean((2, 3)))


def model_and_input(case: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """The model and input of ``case``; ``seed`` picks the weights."""
    torch.manual_seed(seed)
    model = CoshNet() if case.startswith("partitioned") else SmallNet()
    torch.manual_seed(100)
    return model.eval(), torch.randn(2, 3, 10, 10)


def load_case(folder: Path, case: str, seed: int = 0) -> dict:
    """Load ``case`` for the model of ``seed`` and call it once: outputs, report, or error."""
    model, x = model_and_input(case, seed)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn = embedl_dynamo.load_compiled(folder / f"{case}.pt", model)
            with torch.no_grad():
                y = fn(x)
    except embedl_dynamo.EmbedlDynamoError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    report = fn.report
    return {
        "seconds": time.perf_counter() - start,
        "output": y.tolist(),
        "loaded": [p.loaded for p in (report.partitions or [report])],
        "status": report.status,
        "report": str(report),
        "warnings": [str(w.message) for w in caught if "saved function" in str(w.message)],
    }


def main() -> None:
    folder, cases = Path(sys.argv[1]), sys.argv[2:]
    results = {case: load_case(folder, case) for case in cases}
    results["other weights"] = load_case(folder, cases[0], seed=1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
