"""A saved compiled function loaded in a fresh process (:mod:`tests.dynamo.saved_worker`): no
Dynamo trace, every artifact loaded (from the bundle beside the file, or from the cache read
only), outputs equal to the saving process's, and a model with other weights refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import embedl_dynamo
from tests.dynamo.saved_worker import model_and_input

REPO = Path(__file__).resolve().parents[2]
CASES = {
    "fp32": {"bundle": True},  # read from the bundle beside the file
    "int8": {"precision": "int8", "accuracy_budget": 0.5},  # from the cache, read only
    "partitioned": {},  # cosh stays in PyTorch between two runtime fragments
}


def _save(folder: Path) -> dict[str, list]:
    expected = {}
    for case, options in CASES.items():
        model, x = model_and_input(case)
        if options.get("precision") == "int8":
            options = dict(options, calibration_data=[(x * (1 + i / 4),) for i in range(2)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn = embedl_dynamo.save_compiled(
                model, x, folder / f"{case}.pt", backend="embedl_onnxruntime", **options
            )
            with torch.no_grad():
                expected[case] = fn(x).tolist()
    embedl_dynamo.wait_for_cache_writes()
    return expected


@pytest.mark.slow  # two compiles and a fresh process: about 20 s on 2 busy cores
def test_a_fresh_process_loads_every_saved_function(tmp_path):
    expected = _save(tmp_path)
    env = dict(os.environ, EMBEDL_DYNAMO_CACHE_READ_ONLY="1", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "tests.dynamo.saved_worker", str(tmp_path), *CASES],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    for case in CASES:
        result = results[case]
        assert "error" not in result, result
        assert all(result["loaded"]) and not result["warnings"], result
        # the same artifacts on the same runtime: the saving process's numbers
        torch.testing.assert_close(
            torch.tensor(result["output"]), torch.tensor(expected[case]), rtol=1e-6, atol=1e-6
        )
    assert results["partitioned"]["status"] == "partitioned"
    assert (
        "weight conv1.weight (8, 3, 3, 3) holds other values" in results["other weights"]["error"]
    )
