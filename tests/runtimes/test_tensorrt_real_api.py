"""The ``tensorrt`` runtime against NVIDIA's real TensorRT 11.0 bindings, on CPU.

Every call our engine builder, engine loader and executor make goes through
:class:`tests.tensorrt_api.ValidatingTensorRT`: it must exist on the real class and bind to a real
pybind11 signature. Behind it a stand-in engine runs the parsed ONNX file with ONNX Runtime,
reading inputs from and writing outputs to the device pointers our code hands over, so a whole
``torch.compile`` -> engine -> call flow runs and its numbers are checked against eager.
"""

from __future__ import annotations

import ctypes
import json
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import embedl_dynamo
from embedl_dynamo.runtimes.tensorrt import runtime as trt_runtime
from tests.helpers import BUILD_COUNTS
from tests.tensorrt_api import SignatureError, ValidatingTensorRT, load_bindings

_ONNX_TO_NUMPY = {1: np.float32, 10: np.float16, 7: np.int64, 6: np.int32, 9: np.bool_}


@pytest.fixture(scope="session")
def real_trt(tmp_path_factory):
    return load_bindings(tmp_path_factory.mktemp("tensorrt_stand_in_libs"))


class _Stream:
    """torch.cuda.Stream on CPU: a non-default handle, ordering calls recorded."""

    def __init__(self, device=None, handle: int = 4242) -> None:
        self.cuda_stream, self.waited = handle, []

    def wait_stream(self, other) -> None:
        self.waited.append(other.cuda_stream)


def _stand_in(trt, profile_log: list, executions: list) -> dict:
    """Scripted Builder / OnnxParser / Runtime whose engine runs the ONNX file with ORT."""

    class Network:
        def __init__(self):
            self.model = None

        @property
        def num_inputs(self):
            return len(self.model.graph.input)

        def get_input(self, index):
            return types.SimpleNamespace(name=self.model.graph.input[index].name)

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, input, min, opt, max):
            self.shapes[input] = [list(min), list(opt), list(max)]

    class Config:
        def __init__(self):
            self.profiles = []

        def add_optimization_profile(self, profile):
            self.profiles.append(profile._fake.shapes)
            return len(self.profiles) - 1

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags=0):
            self.flags = flags
            return Network()

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            (shapes,) = config._fake.profiles
            profile_log.append({"flags": self.flags, "shapes": shapes})
            header = json.dumps({"shapes": shapes}).encode()
            return len(header).to_bytes(4, "little") + header + network._fake.model_bytes

    class Parser:
        num_errors = 0

        def __init__(self, network, logger):
            self.network = network._fake

        def parse(self, model, path=None):
            self.network.model_bytes = bytes(model)
            self.network.model = onnx.load_from_string(bytes(model))
            return True

    class Context:
        def __init__(self, engine):
            self.engine, self.shapes, self.addresses, self.results = engine, {}, {}, None

        def set_input_shape(self, name, shape):
            low, _, high = self.engine.shapes[name]
            if not all(lo <= d <= hi for lo, d, hi in zip(low, shape, high)):
                return False
            self.shapes[name] = tuple(shape)
            self.results = None
            return True

        def set_tensor_address(self, name, memory):
            self.addresses[name] = memory
            return True

        def _run(self):
            feeds = {}
            for name in self.engine.inputs:
                dtype = np.dtype(self.engine.dtypes[name])
                shape = self.shapes[name]
                nbytes = int(np.prod(shape)) * dtype.itemsize
                raw = (ctypes.c_byte * nbytes).from_address(self.addresses[name])
                feeds[name] = np.frombuffer(bytes(raw), dtype=dtype).reshape(shape)
            return dict(zip(self.engine.outputs, self.engine.session.run(None, feeds)))

        def get_tensor_shape(self, name):
            self.results = self.results or self._run()
            return tuple(self.results[name].shape)

        def execute_async_v3(self, stream_handle):
            executions.append(stream_handle)
            self.results = self.results or self._run()
            for name in self.engine.outputs:
                value = np.ascontiguousarray(self.results[name])
                ctypes.memmove(self.addresses[name], value.ctypes.data, value.nbytes)
            self.results = None
            return True

    class Engine:
        def __init__(self, data: bytes):
            size = int.from_bytes(data[:4], "little")
            self.shapes = json.loads(data[4 : 4 + size])["shapes"]
            model = onnx.load_from_string(data[4 + size :])
            self.session = ort.InferenceSession(model.SerializeToString())
            self.inputs = [i.name for i in model.graph.input]
            self.outputs = [o.name for o in model.graph.output]
            self.dtypes = {
                v.name: _ONNX_TO_NUMPY[v.type.tensor_type.elem_type]
                for v in [*model.graph.input, *model.graph.output]
            }

        @property
        def num_io_tensors(self):
            return len(self.inputs) + len(self.outputs)

        def get_tensor_name(self, index):
            return [*self.inputs, *self.outputs][index]

        def get_tensor_mode(self, name):
            return trt.TensorIOMode.INPUT if name in self.inputs else trt.TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name):
            return {np.float32: trt.float32, np.float16: trt.float16, np.int64: trt.int64}[
                self.dtypes[name]
            ]

        def create_execution_context(self, strategy=None):
            return Context(self)

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, serialized_engine):
            return Engine(bytes(serialized_engine))

    return {"Builder": Builder, "OnnxParser": Parser, "Runtime": Runtime}


@pytest.fixture
def tensorrt_on_cpu(real_trt, monkeypatch):
    """``import tensorrt`` gives the validating proxy; CUDA queries answer as one GPU would, and
    the runtime's device is the CPU so the stand-in engine can read the tensors."""
    profiles, executions = [], []
    api = ValidatingTensorRT(real_trt, _stand_in(real_trt, profiles, executions))
    api.__spec__ = real_trt.__spec__
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", api)

    def missing(cls):  # the real checks (import, version), with a CUDA device reported
        with pytest.MonkeyPatch.context() as cuda:
            cuda.setattr(torch.cuda, "is_available", lambda: True)
            return trt_runtime._missing.__wrapped__()

    monkeypatch.setattr(trt_runtime.TensorRTRuntime, "missing", classmethod(missing))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "stand-in GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream(handle=0))
    monkeypatch.setattr(trt_runtime, "target_device", lambda: torch.device("cpu"))
    yield types.SimpleNamespace(api=api, profiles=profiles, executions=executions)


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, image, bias):
        return self.fc(torch.relu(self.conv(image)).mean((2, 3))) + bias


def test_compile_builds_loads_and_runs_through_the_real_api(tensorrt_on_cpu, tmp_path):
    model = _TwoInputs().eval()
    image, bias = torch.randn(2, 3, 8, 8), torch.randn(2, 4)
    compiled = torch.compile(
        model,
        backend="embedl_tensorrt",
        options={"runtime": "tensorrt", "fallback": "raise", "cache_dir": str(tmp_path)},
    )
    before = BUILD_COUNTS.get("trt_engine", 0)
    with torch.inference_mode():
        out = compiled(image, bias)
        torch.testing.assert_close(out, model(image, bias), rtol=1e-4, atol=1e-5)
        assert embedl_dynamo.last_report()[0].runtime == "tensorrt"
        # a batch inside the profile (1..32): Dynamo recompiles once, the engine is reused
        small = (torch.randn(5, 3, 8, 8), torch.randn(5, 4))
        torch.testing.assert_close(compiled(*small), model(*small), rtol=1e-4, atol=1e-5)
    assert BUILD_COUNTS.get("trt_engine", 0) - before == 1
    calls = tensorrt_on_cpu.api.calls
    for expected in (
        "Builder.__init__",
        "Builder.create_network",
        "OnnxParser.parse",
        "IOptimizationProfile.set_shape",
        "Builder.build_serialized_network",
        "Runtime.deserialize_cuda_engine",
        "ICudaEngine.create_execution_context",
        "IExecutionContext.set_input_shape",
        "IExecutionContext.set_tensor_address",
        "IExecutionContext.execute_async_v3",
    ):
        assert expected in calls, expected
    (profile,) = tensorrt_on_cpu.profiles
    real = tensorrt_on_cpu.api.trt
    assert profile["flags"] == 1 << int(real.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert sorted(profile["shapes"].values()) == [
        [[1, 3, 8, 8], [2, 3, 8, 8], [32, 3, 8, 8]],
        [[1, 4], [2, 4], [32, 4]],
    ]
    # our own stream, not the default one (handle 0)
    assert set(tensorrt_on_cpu.executions) == {4242}


def test_a_call_outside_the_profile_names_the_option_and_runs_in_pytorch(
    tensorrt_on_cpu, tmp_path, caplog
):
    model = _TwoInputs().eval()
    compiled = torch.compile(
        model,
        backend="embedl_tensorrt",
        options={"runtime": "tensorrt", "cache_dir": str(tmp_path), "max_batch": 4},
    )
    with torch.inference_mode():  # a dynamic batch from the first call: no recompile later
        image, bias = torch.randn(2, 3, 8, 8), torch.randn(2, 4)
        torch._dynamo.mark_dynamic(image, 0)
        torch._dynamo.mark_dynamic(bias, 0)
        compiled(image, bias)
        big = (torch.randn(6, 3, 8, 8), torch.randn(6, 4))
        torch.testing.assert_close(compiled(*big), model(*big))
    assert "outside the engine's optimisation profile" in caplog.text
    assert "max_batch" in caplog.text


def test_loaded_engine_checks_inputs_against_the_engine(tensorrt_on_cpu, tmp_path):
    model = _TwoInputs().eval()
    image, bias = torch.randn(1, 3, 8, 8), torch.randn(1, 4)
    path = embedl_dynamo.export(model, (image, bias), tmp_path / "m.onnx", verify=False)
    engine_file = tmp_path / "m.engine"
    runtime = trt_runtime.TensorRTRuntime()
    onnx_inputs = [i.name for i in onnx.load(path).graph.input]
    profile = [
        ((1, 3, 8, 8), (1, 3, 8, 8), (4, 3, 8, 8)),
        ((1, 4), (1, 4), (4, 4)),
    ]
    engine_file.write_bytes(trt_runtime.build_engine(tensorrt_on_cpu.api, path, profile))
    runtime = trt_runtime.TensorRTRuntime.load_artifact(engine_file)
    assert runtime.input_names == onnx_inputs
    loaded = embedl_dynamo.load(engine_file)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(image, bias), model(image, bias), rtol=1e-4, atol=1e-5)
        with pytest.raises(TypeError, match=r"is float64, the file takes float32"):
            loaded(image.double(), bias.double())
        with pytest.raises(ValueError, match="takes 2 inputs"):
            runtime.infer(image)


def test_every_tensorrt_dtype_maps_to_torch_or_is_a_clear_error(real_trt):
    """uint8/fp8 outputs no longer raise KeyError; an unmapped type says which."""
    mapped = {}
    for name, dtype in real_trt.DataType.__members__.items():
        try:
            mapped[name] = trt_runtime._torch_dtype(real_trt, dtype)
        except TypeError as exc:
            assert "has no torch equivalent" in str(exc)
    assert mapped["UINT8"] is torch.uint8 and mapped["FP8"] is torch.float8_e4m3fn
    assert mapped["HALF"] is torch.float16 and mapped["BF16"] is torch.bfloat16


def test_the_proxy_rejects_what_the_real_api_rejects(tensorrt_on_cpu):
    """The checks above can fail: wrong names, argument counts and types are refused."""
    api = tensorrt_on_cpu.api
    builder = api.Builder(api.Logger(api.Logger.WARNING))
    with pytest.raises(SignatureError, match="fits no overload"):
        builder.create_network(0, 1)
    with pytest.raises(SignatureError, match="fits no overload"):
        builder.create_network("STRONGLY_TYPED")
    with pytest.raises(AttributeError, match="has no 'create_network_v2'"):
        builder.create_network_v2()
    network = builder.create_network(0)
    with pytest.raises(AttributeError, match="has no 'num_input'"):
        network.num_input  # noqa: B018
    profile = builder.create_optimization_profile()
    with pytest.raises(SignatureError, match="do not fit"):
        profile.set_shape("x", "1,3", (1, 3), (1, 3))
    with pytest.raises(SignatureError, match="do not fit"):  # a network is not a builder config
        builder.build_serialized_network(network, network)
    with pytest.raises(SignatureError):  # Builder(logger) needs an ILogger
        api.Builder("warning")


def test_the_engine_is_exported_from_a_cpu_copy_and_the_graph_is_not_moved(
    tensorrt_on_cpu, tmp_path, monkeypatch
):
    """The ONNX export gets a CPU copy of the graph with CPU inputs (on a GPU model the live
    graph keeps its weights on the GPU), and the graph the eager fallback runs is not moved."""
    from embedl_dynamo.settings import Settings
    from embedl_dynamo.transform import transform

    model = _TwoInputs().eval()
    image, bias = torch.randn(2, 3, 8, 8), torch.randn(2, 4)
    gm = transform(model, (image, bias), []).model
    before = {n: t for n, t in gm.state_dict(keep_vars=True).items()}
    exported = []
    real = trt_runtime.onnx_artifact

    def spy(graph, inputs, settings, axes=None):
        exported.append((graph, [t.device.type for t in inputs]))
        return real(graph, inputs, settings, axes)

    monkeypatch.setattr(trt_runtime, "onnx_artifact", spy)
    runtime = trt_runtime.TensorRTRuntime(Settings(cache_dir=tmp_path)).build(gm, [image, bias])
    ((graph, devices),) = exported
    assert graph is not gm and devices == ["cpu", "cpu"]
    assert {t.device.type for t in graph.state_dict().values()} == {"cpu"}
    after = gm.state_dict(keep_vars=True)
    assert all(after[n] is t for n, t in before.items())  # not moved in place
    with torch.inference_mode():
        torch.testing.assert_close(runtime.infer(image, bias)[0], model(image, bias))


def test_int8_without_modelopt_goes_onnx_to_tensorrt_and_says_so(
    tensorrt_on_cpu, tmp_path, monkeypatch
):
    from embedl_dynamo.runtimes.torch_tensorrt.runtime import TorchTensorRTRuntime
    from embedl_dynamo.tuning import routing

    monkeypatch.setattr(TorchTensorRTRuntime, "missing", classmethod(lambda cls: None))
    monkeypatch.setattr(routing, "has_quantize_op", lambda: False)
    model = _TwoInputs().eval()
    batches = [(torch.randn(2, 3, 8, 8), torch.randn(2, 4)) for _ in range(3)]
    options = {
        "runtime": "torch_tensorrt",
        "precision": "int8",
        "calibration_data": batches,
        "cache_dir": str(tmp_path),
        "fallback": "raise",
    }
    compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
    with torch.inference_mode():
        out = compiled(*batches[0])
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.runtime == "tensorrt" and sub.pipeline["precision"] == "int8"
    assert "INT8 through ONNX -> TensorRT" in sub.reason and "nvidia-modelopt" in sub.reason
    cosine = torch.nn.functional.cosine_similarity(
        out.flatten(), model(*batches[0]).flatten(), dim=0
    )
    assert cosine > 0.99
