"""``load()``'s guards on what a call or an argument may hold: NaN and infinities where the file's
runtime would answer them with finite numbers (OpenVINO, quantized activations), PyTorch's
device forms, and a bounded thread count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.deploy.sidecar_fields import max_threads


class _Net(nn.Module):
    """The ops whose NaN OpenVINO turns into numbers (ReLU, Hardtanh), and none that ONNX Runtime
    computes otherwise on NaN (a convolution or a pooling window: the table lists both runtimes
    for those, and both refuse NaN then, tests/deploy/test_export_conformance.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(48, 16)
        self.fc = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.proj(x.flatten(1)))
        return self.fc(nn.functional.hardtanh(y))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    pytest.importorskip("openvino")
    torch.manual_seed(0)
    model = _Net().eval()
    root = tmp_path_factory.mktemp("guards")
    options = {"cache_dir": root / "cache"}
    x = torch.randn(2, 3, 4, 4)
    paths = {}
    for backend in ("openvino", "onnxruntime"):
        path = root / f"{backend}.onnx"
        paths[backend] = export(model, x, path, backend=backend, progress=False, options=options)
    return model, paths


def _with_nan() -> torch.Tensor:
    x = torch.randn(2, 3, 4, 4)
    x[0, 1, 2, 2] = float("nan")
    return x


def test_openvino_refuses_a_nan_call_naming_the_input_and_the_fix(files):
    model, paths = files
    module = load(paths["openvino"])
    assert module.runtime == "openvino" and module.non_finite is not None
    refusal = r"input 0 \(input_0\) holds NaN or infinity: OpenVINO.*runtime='onnxruntime'"
    for bad in (_with_nan(), torch.full((1, 3, 4, 4), float("inf"))):
        with pytest.raises(ValueError, match=refusal):
            module(bad)
    clean = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(module(clean), model(clean), atol=0.05, rtol=0.05)
    module.non_finite = None  # what the guard prevents: a finite answer where PyTorch has NaN
    x = _with_nan()
    with torch.no_grad():
        assert torch.isnan(model(x)[0]).all() and torch.isfinite(module(x)[0]).all()


def test_onnxruntime_answers_nan_as_pytorch_does_so_it_is_not_guarded(files):
    model, paths = files
    module = load(paths["openvino"], runtime="onnxruntime")  # the fix the message names
    assert module.non_finite is None
    x = _with_nan()
    with torch.no_grad():
        want = model(x)
        got = module(x)
    assert torch.isnan(got[0]).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_a_file_quantizing_activations_refuses_nan_on_every_runtime(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    calibration = [torch.randn(4, 3, 8, 8) for _ in range(4)]
    path = export(
        model,
        torch.randn(2, 3, 8, 8),
        tmp_path / "q.onnx",
        backend="onnxruntime",
        precision="int8",
        calibration_data=calibration,
        progress=False,
        options={"cache_dir": tmp_path / "cache"},
    )
    module = load(path)
    assert module.runtime == "onnxruntime"
    x = torch.randn(1, 3, 8, 8)
    x[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"quantizes activations \(int8\).*precision='fp32'"):
        module(x)


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_pytorchs_device_forms_are_taken_or_refused_in_one_line(files, runtime):
    _, paths = files
    for device in (None, "cpu", torch.device("cpu")):
        assert load(paths[runtime], device=device, runtime=runtime).runtime == runtime
    ort = pytest.importorskip("onnxruntime")
    if runtime == "onnxruntime" and "CUDAExecutionProvider" in ort.get_available_providers():
        return  # CUDA 0 exists here
    # CUDA 0 on a machine without CUDA (or OpenVINO, which has no CUDA device): a clear refusal
    for device in (0, torch.device("cuda", 0)):
        with pytest.raises(ValueError, match=r"CUDA:0|onnxruntime-gpu"):
            load(paths[runtime], device=device, runtime=runtime)
    with pytest.raises(ValueError, match=r"invalid device=1.5; expected 'auto'"):
        load(paths[runtime], device=1.5, runtime=runtime)


def test_num_threads_is_bounded_as_the_sidecars_is(files):
    _, paths = files
    for bad in (0, max_threads() + 1, 2.0):
        with pytest.raises(ValueError, match=rf"invalid num_threads={bad!r}; expected None or"):
            load(paths["onnxruntime"], num_threads=bad)
