"""Tests for the ``embedl-dynamo`` command line (in process through ``main``, plus subprocesses)."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from embedl_dynamo import cli
from embedl_dynamo.cli import (
    EXIT_EXPORT,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_VERIFY,
    main,
)

verify_module = importlib.import_module("embedl_dynamo.deploy.verify")

_NET = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            y = torch.relu(self.bn(self.conv(x)))
            return self.fc(y.mean(dim=(2, 3)))

    def build():
        torch.manual_seed(0)
        return Net()

    def not_a_model():
        return 42
    """
)


@pytest.fixture
def net_py(tmp_path: Path) -> str:
    path = tmp_path / "net.py"
    path.write_text(_NET)
    return str(path)


def _export_argv(model: str, shape: str, out: object, *options: str) -> list[str]:
    """``embedl-dynamo export MODEL --input-shape SHAPE -o OUT`` followed by ``options``."""
    return ["export", model, "--input-shape", shape, "-o", str(out), *options]


def _one_line_error(err: str, text: str) -> None:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert text in lines[0], lines[0]


def test_backends_lists_backends_pattern_counts_and_runtimes(capsys) -> None:
    assert main(["backends"]) == EXIT_OK
    out = capsys.readouterr().out
    for name in ("tensorrt", "onnxruntime", "lattice", "embedl_tensorrt"):
        assert name in out
    assert "conversion  fusion  smooth  quantized" in out
    assert "onnxruntime     yes" in out
    from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime

    missing = TensorRTRuntime.missing()
    if missing is not None:
        assert missing in out  # the reason a runtime is unavailable here


def test_plan_prints_the_table(capsys) -> None:
    assert main(["plan", "tests.models:ResNetLike", "--input-shape", "1,3,32,32"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["id", "pattern", "node", "apply", "reason"]
    assert "conv_bn_relu_maxpool@conv1" in out or "conv_bn_relu@conv1" in out
    assert "overlaps " in out
    assert " applied, " in out and "backend tensorrt" in out


def test_export_from_a_py_file_writes_onnx_and_sidecar(tmp_path, net_py, capsys) -> None:
    out_path = tmp_path / "net.onnx"
    argv = _export_argv(
        f"{net_py}:build", "2,3,16,16", out_path, "--cache-dir", str(tmp_path / "cache"), "-q"
    )
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert f"wrote {out_path}" in out and "max abs diff" in out
    side = json.loads(out_path.with_suffix(".json").read_text())
    assert side["verification"]["passed"] is True
    assert side["inputs"][0]["shape"] == ["batch", 3, 16, 16]


def test_export_writes_a_triton_repository(tmp_path, net_py, capsys) -> None:
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    out_path, repo = tmp_path / "net.onnx", tmp_path / "repo"
    argv = _export_argv(
        f"{net_py}:build",
        "2,3,16,16",
        out_path,
        "--backend",
        "openvino",
        "--triton-repository",
        str(repo),
        "--triton-name",
        "net",
        "--triton-instances",
        "2",
        "--triton-threads",
        "1",
        "-q",
    )
    assert main(argv) == EXIT_OK
    assert f"wrote Triton model {repo / 'net'}" in capsys.readouterr().out
    config = text_format.Parse(
        (repo / "net" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert (config.backend, config.max_batch_size, list(config.input[0].dims)) == (
        "openvino",
        8,
        [3, 16, 16],
    )
    assert config.parameters["INFERENCE_NUM_THREADS"].string_value == "2"
    assert (repo / "net" / "1" / "model.onnx").read_bytes() == out_path.read_bytes()


@pytest.mark.parametrize("suffix", [".npy", ".pt"])
def test_export_int8_with_calibration_file(tmp_path, net_py, suffix) -> None:
    data = torch.randn(8, 3, 16, 16)
    calib = tmp_path / f"calib{suffix}"
    if suffix == ".npy":
        np.save(calib, data.numpy())
    else:
        torch.save(list(data.split(4)), calib)
    out_path = tmp_path / "q.onnx"
    argv = _export_argv(
        f"{net_py}:build",
        "2,3,16,16",
        out_path,
        "--int8",
        "--calibration",
        str(calib),
        "--backend",
        "onnxruntime",
        "--cache-dir",
        str(tmp_path / "cache"),
        "-q",
    )
    assert main(argv) == EXIT_OK
    side = json.loads(out_path.with_suffix(".json").read_text())
    assert side["quantized"] is True and side["quantization"]["scales"]


def test_bench_prints_a_table_and_plots(tmp_path, net_py, capsys) -> None:
    png = tmp_path / "lat.png"
    argv = [
        "bench",
        f"{net_py}:build",
        "--input-shape",
        "1,3,16,16",
        "--no-int8",
        "--repeats",
        "3",
        "--warmup",
        "1",
        "--plot",
        str(png),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert "eager" in out and "embedl_tensorrt float" in out and "median ms" in out
    assert "embedl_tensorrt float: subgraph 0: compiled on" in out  # not an eager fallback
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "code", "text"),
    [
        (["plan", "tests.models:Nope", "--input-shape", "1,3,8,8"], EXIT_USAGE, "has no 'Nope'"),
        (["plan", "no_such_module_xyz:f", "--input-shape", "1"], EXIT_USAGE, "cannot import"),
        (["plan", "tests.models", "--input-shape", "1"], EXIT_USAGE, "is not MODULE:FACTORY"),
        (
            ["plan", "tests.models:ResNetLike", "--input-shape", "1,3,32,32", "--backend", "gpu9"],
            EXIT_USAGE,
            "unknown backend 'gpu9'; known backends: lattice, onnxruntime, openvino, tensorrt",
        ),
        (["plan", "{net}:not_a_model", "--input-shape", "1"], EXIT_USAGE, "not a torch.nn.Module"),
        (
            _export_argv("{net}:build", "1,3,8,8", "{tmp}/m.onnx", "--calibration", "{tmp}/c.npy"),
            EXIT_USAGE,
            "only used with --precision int8/mixed",
        ),
        (
            _export_argv(
                "{net}:build",
                "1,3,8,8",
                "{tmp}/m.onnx",
                "--int8",
                "--calibration",
                "{tmp}/missing.npy",
            ),
            EXIT_USAGE,
            "does not exist",
        ),
        (
            ["export", "{net}:build", "--input-shape", "1,3,8,8", "-o", "{tmp}/m.txt"],
            EXIT_USAGE,
            "must end in .onnx",
        ),
        (
            _export_argv("tests.models:GraphBreakNet", "2,3,16,16", "{tmp}/g.onnx"),
            EXIT_EXPORT,
            "Export needs one graph",
        ),
    ],
)
def test_errors_are_one_line_with_exit_codes(tmp_path, net_py, capsys, argv, code, text) -> None:
    argv = [a.format(net=net_py, tmp=tmp_path) for a in argv]
    quiet = ["-q"] if argv[0] == "export" else []
    assert main([*argv, *quiet, "--cache-dir", str(tmp_path / "c")]) == code
    _one_line_error(capsys.readouterr().err, text)


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["serve", "{tmp}/missing.onnx"], "no file at"),
        (["serve", "{file}", "--min-replicas", "1"], "give both --min-replicas and --max-replicas"),
    ],
)
def test_serve_refuses_bad_arguments_before_starting_ray(tmp_path, capsys, argv, text) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    argv = [a.format(tmp=tmp_path, file=tmp_path / "m.onnx") for a in argv]
    assert main(argv) == EXIT_USAGE
    _one_line_error(capsys.readouterr().err, text)


def test_bad_input_shape_is_a_usage_error(capsys) -> None:
    assert main(["plan", "tests.models:ResNetLike", "--input-shape", "1,a"]) == EXIT_USAGE
    assert "invalid input shape '1,a'" in capsys.readouterr().err


def test_verification_failure_exits_4(tmp_path, net_py, monkeypatch, capsys) -> None:
    real = verify_module.run_onnx
    monkeypatch.setattr(verify_module, "run_onnx", lambda p, a: [o * 2 + 1 for o in real(p, a)])
    argv = _export_argv(
        f"{net_py}:build",
        "1,3,8,8",
        tmp_path / "m.onnx",
        "--cache-dir",
        str(tmp_path / "c"),
        "-q",
    )
    assert main(argv) == EXIT_VERIFY
    _one_line_error(capsys.readouterr().err, "differs from PyTorch")
    assert main([*argv, "--no-verify"]) == EXIT_OK


def test_engine_without_tensorrt_exits_5(tmp_path, net_py, capsys) -> None:
    from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime

    if TensorRTRuntime.missing() is None:
        pytest.skip("TensorRT is installed here: the unavailable path does not apply")
    argv = _export_argv(
        f"{net_py}:build",
        "1,3,8,8",
        tmp_path / "m.onnx",
        "--engine",
        "--cache-dir",
        str(tmp_path / "c"),
        "-q",
    )
    assert main(argv) == EXIT_UNAVAILABLE
    _one_line_error(capsys.readouterr().err, "engine=True needs TensorRT")


def test_internal_error_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys) -> None:
    def _boom(args):
        raise KeyError("bug")

    monkeypatch.setitem(cli.commands.COMMANDS, "backends", _boom)
    assert main(["backends"]) == EXIT_INTERNAL
    _one_line_error(capsys.readouterr().err, "internal error: KeyError")
    assert main(["--debug", "backends"]) == EXIT_INTERNAL  # --debug never changes the code
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter importing torch; main() runs in-process by default
def test_console_script_runs_in_a_subprocess(tmp_path) -> None:
    exe = shutil.which("embedl-dynamo") or str(Path(sys.executable).parent / "embedl-dynamo")
    ok = subprocess.run([exe, "backends"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == EXIT_OK, ok.stderr
    assert "embedl_tensorrt" in ok.stdout
    bad = subprocess.run(
        [exe, "plan", "no_such_module_xyz:f", "--input-shape", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert bad.returncode == EXIT_USAGE
    _one_line_error(bad.stderr, "cannot import 'no_such_module_xyz'")


def test_a_user_file_named_like_a_package_does_not_shadow_it(tmp_path, capsys) -> None:
    user = tmp_path / "onnx.py"  # the user's own onnx.py must not replace the onnx package
    user.write_text(_NET)
    argv = _export_argv(
        f"{user}:build",
        "1,3,8,8",
        tmp_path / "m.onnx",
        "--cache-dir",
        str(tmp_path / "c"),
        "-q",
    )
    assert main(argv) == EXIT_OK
    import onnx

    assert Path(onnx.__file__).parent.name == "onnx" and hasattr(onnx, "load")


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("def build(width):\n    return width\n", "build() failed: TypeError"),
        ("def build():\n    raise RuntimeError('no weights')\n", "build() failed: RuntimeError"),
        ("import not_a_module_anywhere\n", "fails to import: ModuleNotFoundError"),
    ],
)
def test_factory_problems_are_usage_errors(tmp_path, capsys, source, text) -> None:
    path = tmp_path / "bad.py"
    path.write_text(source)
    assert main(["plan", f"{path}:build", "--input-shape", "1,3,8,8"]) == EXIT_USAGE
    _one_line_error(capsys.readouterr().err, text)


@pytest.mark.parametrize("opset", ["5", "99"])
def test_an_opset_outside_the_writable_range_is_a_usage_error_and_writes_nothing(
    tmp_path, net_py, capsys, opset
) -> None:
    out = tmp_path / "m.onnx"
    argv = _export_argv(f"{net_py}:build", "1,3,8,8", out, "--opset", opset, "-q")
    assert main(argv) == EXIT_USAGE
    _one_line_error(capsys.readouterr().err, f"invalid opset={opset}")
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_the_sidecar_records_the_opset_in_the_file(tmp_path, net_py) -> None:
    import json

    import onnx

    out = tmp_path / "m.onnx"
    argv = ["export", f"{net_py}:build", "--input-shape", "1,3,8,8", "-o", str(out), "-q"]
    assert main(argv) == EXIT_OK
    (default,) = [
        o.version for o in onnx.load(str(out)).opset_import if o.domain in ("", "ai.onnx")
    ]
    assert json.loads(out.with_suffix(".json").read_text())["opset"] == default


def test_a_wrong_input_shape_is_a_shape_problem_whatever_debug_says(tmp_path, net_py, capsys):
    """Regression (issue 12 item 20): it read "remove the graph break", and --debug changed 3 to 1."""
    linear = tmp_path / "linear.py"
    linear.write_text("from torch import nn\ndef build():\n    return nn.Linear(8, 4)\n")
    for command in (["export", "-o", str(tmp_path / "m.onnx"), "-q"], ["plan"]):
        argv = [command[0], f"{linear}:build", "--input-shape", "2,9", *command[1:]]
        assert main(argv) == EXIT_USAGE
        _one_line_error(capsys.readouterr().err, "fails in PyTorch itself on random inputs (2, 9)")
        assert main(["--debug", *argv]) == EXIT_USAGE
        last = capsys.readouterr().err.strip().splitlines()[-1]  # after the traceback
        assert "(2, 9) float32" in last and "graph break" not in last
    assert not (tmp_path / "m.onnx").exists()


def test_an_unwritable_output_directory_exits_3(tmp_path, net_py, capsys, monkeypatch):
    """Regression (issue 12 item 20): an unwritable -o was an internal error (exit 1)."""
    import tempfile

    def _denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", _denied)  # root ignores chmod, so deny the write
    argv = ["export", f"{net_py}:build", "--input-shape", "1,3,8,8", "-o", str(tmp_path / "m.onnx")]
    assert main([*argv, "-q"]) == EXIT_EXPORT
    _one_line_error(capsys.readouterr().err, "cannot write to directory")


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (torch.randn(8, 3, 9, 9), "calibration_data does not fit the model's inputs"),
        (torch.full((8, 3, 16, 16), float("nan")), "non-finite values"),
    ],
)
def test_bad_calibration_files_are_usage_errors(tmp_path, net_py, capsys, data, text) -> None:
    calib = tmp_path / "calib.npy"
    np.save(calib, data.numpy())
    out = tmp_path / "q.onnx"
    argv = _export_argv(
        f"{net_py}:build",
        "2,3,16,16",
        out,
        "--int8",
        "--calibration",
        str(calib),
        "--backend",
        "onnxruntime",
        "-q",
    )
    assert main(argv) == EXIT_USAGE
    _one_line_error(capsys.readouterr().err, text)
    assert not out.exists()


def _no_work(monkeypatch):
    """Fail the test if the command builds the model: a path check must come first."""
    from embedl_dynamo.cli import commands

    def model_and_inputs(*args, **kwargs):
        raise AssertionError("the model was built before the output path was checked")

    monkeypatch.setattr(commands, "model_and_inputs", model_and_inputs)


@pytest.mark.parametrize("command", ["export", "plan-html"])
def test_a_file_name_over_the_limit_exits_3_before_the_work(
    tmp_path, net_py, capsys, monkeypatch, command
):
    """Regression (issue 23 item 21): a 300-byte name was an internal error after the work."""
    _no_work(monkeypatch)
    long = str(tmp_path / ("m" * 300 + ".onnx"))
    shape = ["--input-shape", "1,3,8,8"]
    argv = {
        "export": ["export", f"{net_py}:build", *shape, "-o", long, "-q"],
        "plan-html": ["plan", f"{net_py}:build", *shape, "--html", long],
    }[command]
    assert main(argv) == EXIT_EXPORT
    _one_line_error(capsys.readouterr().err, "choose a shorter name")


def test_an_unwritable_plot_path_exits_3_before_the_benchmark(
    tmp_path, net_py, capsys, monkeypatch
):
    """Regression (issue 23 item 21): an unwritable --plot was exit 1 after the whole run."""
    import tempfile

    def _denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    _no_work(monkeypatch)
    monkeypatch.setattr(tempfile, "mkstemp", _denied)  # root ignores chmod, so deny the write
    argv = [
        "bench",
        f"{net_py}:build",
        "--input-shape",
        "1,3,8,8",
        "--plot",
        str(tmp_path / "p.png"),
    ]
    assert main(argv) == EXIT_EXPORT
    _one_line_error(capsys.readouterr().err, "cannot write to directory")
    missing = [
        "bench",
        f"{net_py}:build",
        "--input-shape",
        "1,3,8,8",
        "--plot",
        str(tmp_path / "nowhere" / "p.png"),
    ]
    assert main(missing) == EXIT_EXPORT
    _one_line_error(capsys.readouterr().err, "does not exist")


def test_bench_with_a_wrong_input_shape_is_a_usage_error_as_export_is(tmp_path, capsys):
    """Regression (issue 39 item 10): bench exited 1 ("internal error"), export 2."""
    linear = tmp_path / "linear.py"
    linear.write_text("from torch import nn\ndef build():\n    return nn.Linear(8, 4)\n")
    argv = ["bench", f"{linear}:build", "--input-shape", "2,9", "--no-int8", "--repeats", "1"]
    assert main(argv) == EXIT_USAGE
    _one_line_error(capsys.readouterr().err, "fails in PyTorch itself on random inputs (2, 9)")


_IDS = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 8)
            self.fc = nn.Linear(8, 3)

        def forward(self, ids, mask):
            return self.fc(self.emb(ids)) * mask.unsqueeze(-1)

    def build():
        torch.manual_seed(0)
        return Tagger()
    """
)


def test_integer_inputs_export_with_input_dtype_and_the_error_names_it(tmp_path, capsys):
    """Regression (issue 39 item 10): token ids could not be given, and the error blamed the
    shape."""
    path = tmp_path / "tagger.py"
    path.write_text(_IDS)
    base = [
        "export",
        f"{path}:build",
        "--input-shape",
        "2,5",
        "--input-shape",
        "2,5",
        "-q",
        "--backend",
        "onnxruntime",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert main([*base, "-o", str(tmp_path / "f.onnx")]) == EXIT_USAGE
    error = capsys.readouterr().err
    _one_line_error(error, "(2, 5) float32")
    assert "--input-dtype" in error and "scalar types: Long, Int" in error
    out = tmp_path / "ids.onnx"
    argv = [*base, "-o", str(out), "--input-dtype", "int64", "--input-dtype", "float32"]
    assert main(argv) == EXIT_OK
    side = json.loads(out.with_suffix(".json").read_text())
    assert [i["dtype"] for i in side["inputs"]] == ["int64", "float32"]
    assert (
        main(
            [*base, "-o", str(out), "--input-dtype", "int64"] * 1
            + ["--input-dtype", "int8", "--input-dtype", "bool"]
        )
        == EXIT_USAGE
    )
    _one_line_error(capsys.readouterr().err, "3 --input-dtype for 2 --input-shape")
