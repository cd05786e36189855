"""Every example runs, as a subprocess with small sizes, so none of them rots.

The examples are started together (one module fixture) and each test checks one example's exit
code and output; the third-party Backend is pip-installed into a temporary directory and put on
``PYTHONPATH``, the way a user would install a vendor's package. Examples whose features
other tests cover are ``slow`` (their own fixture, started only when they run): INT8 on the
digits (tests/quant/test_accuracy.py, tests/tuning/test_mixed_accuracy.py), the plan's globs
(tests/rewrite/test_engine.py, tests/cli/test_cli.py's plan), an export loaded at two batch
sizes (the README's export block in tests/docs/test_code_blocks.py, tests/deploy) and a saved
INT8 function started in a fresh process (tests/dynamo/test_saved_process.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

_RUNS = {
    "third_party": ["third_party_backend/demo.py"],
}
_SLOW_RUNS = {
    "quickstart": ["quickstart.py", "--small", "--repeats", "3", "--plan"],
    "export_and_load": ["export_and_load.py", "--small"],
    "int8_digits": ["int8_digits.py", "--epochs", "3", "--calibration-batches", "4"],
    "plan_inspection": ["plan_inspection.py", "--small"],
    "save_and_load": ["save_and_load.py", "--small", "--int8"],
}


def _install_plugin(tmp: Path) -> Path:
    """``pip install --no-deps --no-build-isolation --target`` of a copy of the plug-in."""
    source = tmp / "src"
    shutil.copytree(EXAMPLES / "third_party_backend", source)  # keep build files out of the repo
    target = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def _run_together(
    tmp: Path, examples: dict[str, list[str]], plugin: Path | None = None
) -> dict[str, subprocess.CompletedProcess]:
    env = dict(os.environ, EMBEDL_DYNAMO_CACHE_DIR=str(tmp / "cache"), OMP_NUM_THREADS="1")
    procs = {}
    for name, argv in examples.items():
        run_env = dict(env)
        if name == "third_party":
            run_env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(plugin), env.get("PYTHONPATH")])
            )
        procs[name] = subprocess.Popen(
            [sys.executable, str(EXAMPLES / argv[0]), *argv[1:]],
            cwd=tmp,
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("examples")
    return _run_together(tmp, _RUNS, _install_plugin(tmp))


@pytest.fixture(scope="module")
def slow_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    return _run_together(tmp_path_factory.mktemp("slow_examples"), _SLOW_RUNS)


def _ok(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 0, f"{run.args}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr[-3000:]}"
    return run.stdout


@pytest.mark.slow
def test_quickstart_prints_plan_and_comparison(slow_runs) -> None:
    out = _ok(slow_runs["quickstart"])
    first_screen = out.split("id ", 1)[0]  # everything before the full plan table (--plan)
    assert "compiled on" in first_screen and "rewrites: conv_bn_relu x" in first_screen
    assert "conv_bn_relu@layer1.0.conv1" in out  # the plan table, asked for with --plan
    assert "same top-1: True" in out
    assert "embedl_tensorrt" in out and "median ms" in out


@pytest.mark.slow
def test_int8_digits_prints_accuracies(slow_runs) -> None:
    out = _ok(slow_runs["int8_digits"])
    line = next(line for line in out.splitlines() if line.startswith("test accuracy"))
    float_acc = float(line.split("float ")[1].split("%")[0])
    int8_acc = float(line.split("INT8 ")[1].split("%")[0])
    assert float_acc > 85.0  # a real model trained on real data
    assert int8_acc > float_acc - 2.0


@pytest.mark.slow
def test_export_and_load_round_trips(slow_runs) -> None:
    out = _ok(slow_runs["export_and_load"])
    assert "wrote " in out and "resnet.json" in out
    assert "runtime='onnxruntime'" in out
    assert "batch 1: output (1, 10)" in out and "batch 5: output (5, 10)" in out
    diffs = [
        float(line.rsplit(" ", 1)[1])
        for line in out.splitlines()
        if "max abs diff to eager" in line
    ]
    assert len(diffs) == 2 and max(diffs) < 1e-4  # float export: export verifies 1e-4 of scale


@pytest.mark.slow
def test_plan_inspection_toggles_by_glob(slow_runs) -> None:
    out = _ok(slow_runs["plan_inspection"])
    assert "conv_bn_add_relu@layer4.0.conv3: keep layer4 unfused" in out
    assert "fused convolutions left in layer4: []" in out
    diff = float(out.split("max abs diff to the original: ")[1].split()[0])
    assert diff < 1e-4


def test_third_party_backend_plugs_in_through_entry_points(runs) -> None:
    out = _ok(runs["third_party"])
    assert "dynamo backends: ['embedl_exampleaccel']" in out
    assert "'exampleaccel'" in out
    assert "backend exampleaccel" in out and "conv_bn_relu@0" in out
    diff = float(out.split("max abs diff to eager: ")[1].split()[0])
    assert diff < 1e-4


@pytest.mark.slow
def test_save_and_load_starts_a_fresh_process_from_the_saved_function(slow_runs) -> None:
    out = _ok(slow_runs["save_and_load"])
    assert "saved " in out and "model.pt.artifacts" in out
    assert "first output" in out and out.split("load_compiled, ")[1].startswith("loaded")
    diff = float(out.split("max abs diff to the saving process: ")[1].split()[0])
    assert diff == 0.0  # the same INT8 artifact on the same runtime
