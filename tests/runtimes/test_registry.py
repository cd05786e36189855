"""The runtime registry: the one table of runtimes, plug-ins, and the facts each class declares."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence
from importlib import metadata

import onnx
import pytest
import torch
from onnx import helper

import embedl_dynamo
from embedl_dynamo.backends.onnxruntime import BACKEND as ONNXRUNTIME
from embedl_dynamo.backends.openvino import BACKEND as OPENVINO
from embedl_dynamo.backends.tensorrt import BACKEND as TENSORRT
from embedl_dynamo.cache.keys import library_versions
from embedl_dynamo.runtimes import registry
from embedl_dynamo.runtimes.base import Runtime
from embedl_dynamo.runtimes.eager.runtime import EagerRuntime
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime
from embedl_dynamo.runtimes.torch_tensorrt.runtime import TorchTensorRTRuntime
from embedl_dynamo.settings import Settings
from tests.models import ResNetLike, randomize_batchnorm


@pytest.fixture(autouse=True)
def _fresh_registry():
    registry.reset_runtimes()
    yield
    registry.reset_runtimes()


class DummyRuntime(Runtime):
    """Runs the transformed graph in PyTorch and counts the calls: a third-party runtime."""

    name = "dummy"
    calls = 0

    @classmethod
    def version(cls) -> str | None:
        return "1.0"

    def _build(self, gm, example_inputs) -> None:
        self._gm = gm
        self.build_info = {"nodes": len(gm.graph.nodes)}

    def _infer(self, args: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        type(self).calls += 1
        with torch.no_grad():
            out = self._gm(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _compile_with(runtime: str, tmp_path):
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    options = {"cache_dir": str(tmp_path), "runtime": runtime, "fallback": "raise"}
    compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    return embedl_dynamo.last_report()


def test_a_registered_runtime_compiles_a_model(tmp_path, compile_isolation):
    registry.register_runtime(DummyRuntime)
    DummyRuntime.calls = 0
    assert "dummy" in registry.runtime_names() and "dummy" in registry.auto_order()
    report = _compile_with("dummy", tmp_path)
    assert report and all(s.runtime == "dummy" and s.status == "compiled" for s in report)
    assert DummyRuntime.calls >= 1


def test_an_entry_point_runtime_from_a_module_folder_compiles_a_model(
    tmp_path, monkeypatch, compile_isolation
):
    package = tmp_path / "plugin_runtime"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A third-party runtime: one folder."""
            import torch
            from embedl_dynamo.runtimes.base import Runtime

            class PluginRuntime(Runtime):
                name = "plugin"

                def _build(self, gm, example_inputs):
                    self._gm = gm

                def _infer(self, args):
                    with torch.no_grad():
                        out = self._gm(*args)
                    return tuple(out) if isinstance(out, (tuple, list)) else (out,)
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "plugin_runtime", raising=False)
    point = metadata.EntryPoint(
        "plugin", "plugin_runtime:PluginRuntime", registry.ENTRY_POINT_GROUP
    )
    real = metadata.entry_points

    def entry_points(**kwargs):
        if kwargs.get("group") == registry.ENTRY_POINT_GROUP:
            return [point]
        return real(**kwargs)

    monkeypatch.setattr(registry.metadata, "entry_points", entry_points)
    assert registry.runtime_classes()["plugin"].__module__ == "plugin_runtime"
    report = _compile_with("plugin", tmp_path / "cache")
    assert report and all(s.runtime == "plugin" for s in report)


def test_a_name_registered_twice_is_refused():
    class Other(DummyRuntime):
        pass

    registry.register_runtime(DummyRuntime)
    registry.register_runtime(DummyRuntime)  # the same class again: nothing changes
    with pytest.raises(RuntimeError, match="runtime name 'dummy' is registered twice"):
        registry.register_runtime(Other)

    class Clash(DummyRuntime):
        name = "onnxruntime"

    with pytest.raises(RuntimeError, match="runtime name 'onnxruntime' is registered twice"):
        registry.register_runtime(Clash)

    class Auto(DummyRuntime):
        name = "auto"

    with pytest.raises(ValueError, match="'auto' is reserved"):
        registry.register_runtime(Auto)
    with pytest.raises(TypeError, match="not a Runtime subclass"):
        registry.register_runtime(object)  # type: ignore[arg-type]


def test_an_unknown_runtime_is_refused_where_the_registry_resolves_it():
    with pytest.raises(ValueError, match="invalid runtime='dummy'; valid values: 'auto', "):
        registry.runtime_candidates("dummy")
    registry.register_runtime(DummyRuntime)
    assert registry.runtime_candidates("dummy") == [DummyRuntime]
    backend = embedl_dynamo.Backend("custom", runtimes=("tvm",))
    with pytest.raises(ValueError, match=r"Backend 'custom': unknown runtimes \['tvm'\]; valid: "):
        registry.runtime_candidates("auto", backend)


def test_runtimes_declare_their_own_facts():
    assert registry.auto_order() == [
        "tensorrt",
        "torch_tensorrt",
        "openvino",
        "onnxruntime",
        "eager",
    ]
    assert {c for c in registry.runtime_classes().values() if c.cuda_only} == {
        TensorRTRuntime,
        TorchTensorRTRuntime,
    }
    assert OnnxRuntime.cpu_target is ONNXRUNTIME and OpenVINORuntime.cpu_target is OPENVINO
    assert TensorRTRuntime.cpu_target is None and EagerRuntime.cpu_target is None
    profiled = [c for c in registry.runtime_classes().values() if c.layer_profiler()]
    assert profiled == [OnnxRuntime, OpenVINORuntime]
    assert registry.runtime_for_file("m.onnx") is OnnxRuntime


def test_a_targets_runtimes_lint_its_onnx_file():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert registry.runtime_lint(TENSORRT, model) == []  # TensorRT's lint passes it
    model.opset_import[0].version = 22
    assert any("opset 22" in line for line in registry.runtime_lint(TENSORRT, model))
    assert registry.runtime_lint(ONNXRUNTIME, model) is None  # no runtime of it lints


def test_library_versions_name_every_runtime_timed(monkeypatch):
    before = library_versions([OpenVINORuntime, OnnxRuntime])
    assert before["runtime:openvino"] == OpenVINORuntime.version()
    assert before["runtime:onnxruntime"] == OnnxRuntime.version()
    monkeypatch.setattr(OpenVINORuntime, "version", classmethod(lambda cls: "99.0"))
    after = library_versions([OpenVINORuntime, OnnxRuntime])
    assert after["runtime:openvino"] == "99.0" and after != before


@pytest.mark.skipif(not OpenVINORuntime.is_available(), reason=f"{OpenVINORuntime.missing()}")
def test_a_runtime_choice_is_measured_again_after_an_openvino_upgrade(monkeypatch, tmp_path):
    from embedl_dynamo.graph.capture import capture
    from embedl_dynamo.pipeline import run_pipeline
    from embedl_dynamo.precision import get_precision
    from embedl_dynamo.tuning import runtime_choice

    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike(width=8).eval())
    x = torch.randn(2, 3, 16, 16)
    gm = run_pipeline(capture(model, (x,)), [x], TENSORRT, Settings()).model
    settings = Settings(cache_dir=tmp_path)
    candidates = [OpenVINORuntime, OnnxRuntime]
    measured: list[list[str]] = []

    def fake_timings(winner):
        def timings(runtimes, inputs):  # stand-in timings: no real clock is read
            measured.append(sorted(runtimes))
            return {n: 1.0 if n == winner else 2.0 for n in runtimes}

        return timings

    def choose():
        fp32 = get_precision("fp32")
        options = runtime_choice.run_options(gm, None, candidates[0], candidates, fp32)
        return runtime_choice.fastest(options, [x], settings)

    monkeypatch.setattr(runtime_choice, "measure_runtimes", fake_timings("openvino"))
    assert choose().runtime.name == "openvino"
    assert choose().timings == {}
    assert len(measured) == 1  # the second call took the cached decision
    monkeypatch.setattr(OpenVINORuntime, "version", classmethod(lambda cls: "99.0"))
    monkeypatch.setattr(runtime_choice, "measure_runtimes", fake_timings("onnxruntime"))
    choice = choose()
    assert len(measured) == 2 and choice.runtime.name == "onnxruntime" and choice.timings


def test_a_mixed_decision_is_measured_again_after_an_openvino_upgrade(monkeypatch, tmp_path):
    from embedl_dynamo.tuning import mixed_precision
    from tests.tuning.test_mixed_precision import (
        BATCHES,
        _calibrated,
        _fake_profile,
        _fake_timing,
        _int8_modules,
    )

    calibrated = _calibrated()
    modules = {p.module for p in calibrated.placement.layers.values()}
    profiled: list[str] = []
    fake = _fake_profile(modules)

    def profile(gm, inputs, runs=20, num_threads=None, runtime="onnxruntime", **kw):
        profiled.append(runtime)  # stand-in timings: no real clock is read
        return fake(gm, inputs, runs, num_threads, runtime, **kw)

    monkeypatch.setattr(mixed_precision, "profile_graph", profile)
    _fake_timing(monkeypatch, lambda name, gm: 10.0 - 0.1 * _int8_modules(gm))

    def choose():
        return mixed_precision.choose_mixed(
            calibrated,
            [BATCHES[0]],
            BATCHES,
            budget=0.5,
            cache_dir=tmp_path,
            runtime=OpenVINORuntime,
        )

    first = choose()
    measured = len(profiled)
    assert measured and set(profiled) == {"openvino"}
    assert choose().layers == first.layers and len(profiled) == measured  # cached
    monkeypatch.setattr(OpenVINORuntime, "version", classmethod(lambda cls: "99.0"))
    assert choose().layers == first.layers and len(profiled) == 2 * measured  # measured again
