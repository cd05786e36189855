"""The ``torch_tensorrt`` runtime against Torch-TensorRT 2.13's real Python source, on CPU.

Torch-TensorRT's pure-Python package is imported over the real TensorRT bindings
(:mod:`tests.tensorrt_api`). A ``torch.compile`` with ``runtime="torch_tensorrt"`` then runs its
real Dynamo backend: option parsing, engine-cache set-up, AOT export with its decompositions and
its lowering passes. Only ``compile_module`` (TensorRT conversion, which needs a GPU) is replaced:
it records the lowered graph and settings and returns the graph to run on CPU. Every op of that
graph must have a converter in Torch-TensorRT's registry, so none would run in PyTorch.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.runtimes.torch_tensorrt import runtime as ttrt_runtime
from tests.models import ResNetLike, ViTLike, randomize_batchnorm
from tests.tensorrt_api import forget_modules, import_torch_tensorrt, load_bindings


@pytest.fixture(scope="module")
def torch_tensorrt(tmp_path_factory):
    trt = load_bindings(tmp_path_factory.mktemp("tensorrt_stand_in_libs"))
    with pytest.MonkeyPatch.context() as patch:
        yield import_torch_tensorrt(trt, tmp_path_factory.mktemp("torch_tensorrt"), patch)
    forget_modules(("torch_tensorrt", "tensorrt"))


@pytest.fixture
def lowered(torch_tensorrt, monkeypatch):
    """Graphs and settings Torch-TensorRT's backend would convert to TensorRT."""
    from torch_tensorrt.dynamo.backend import backends

    seen = []

    def compile_module(gm, inputs, settings, engine_cache=None):
        seen.append({"gm": gm, "settings": settings, "engine_cache": engine_cache})
        return gm

    def missing(cls):  # the real checks (import, version pairing), with a CUDA device reported
        with pytest.MonkeyPatch.context() as cuda:
            cuda.setattr(torch.cuda, "is_available", lambda: True)
            return ttrt_runtime._missing.__wrapped__()

    monkeypatch.setattr(backends, "compile_module", compile_module)
    monkeypatch.setattr(ttrt_runtime.TorchTensorRTRuntime, "missing", classmethod(missing))
    monkeypatch.setattr(ttrt_runtime, "target_device", lambda: torch.device("cpu"))
    return seen


def _compile(model, x, tmp_path, **options):
    compiled = torch.compile(
        model,
        backend="embedl_tensorrt",
        options={
            "runtime": "torch_tensorrt",
            "fallback": "raise",
            "cache_dir": str(tmp_path),
            **options,
        },
    )
    with torch.inference_mode():
        out = compiled(x)
    assert embedl_dynamo.last_report()[0].runtime == "torch_tensorrt"
    return out


# Traced on CPU, SDPA dispatches to its CPU kernel; traced on the GPU the same call records the
# flash-attention op, which Torch-TensorRT converts. Check that op for these nodes instead.
_ON_GPU = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: (
        torch.ops.aten._scaled_dot_product_flash_attention.default
    ),
}


def _unconverted(gm, registry) -> list[str]:
    missing = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if source is not None and source.target in _ON_GPU and "getitem" in str(node.target):
            continue  # an output of the attention op, taken apart by its converter
        if node.target in _ON_GPU:
            if _ON_GPU[node.target] not in registry:
                missing.add(str(_ON_GPU[node.target]))
        elif node not in registry:
            missing.add(str(node.target))
    return sorted(missing)


def test_our_options_reach_its_settings_and_engine_cache(lowered, torch_tensorrt, tmp_path):
    from torch_tensorrt.dynamo import CompilationSettings, _defaults
    from torch_tensorrt.dynamo._engine_cache import DiskEngineCache

    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        torch.testing.assert_close(_compile(model, x, tmp_path), model(x), rtol=1e-4, atol=1e-4)
    (call,) = lowered
    settings = call["settings"]
    # the cache engages only with refittable engines, and the default is immutable
    assert _defaults.IMMUTABLE_WEIGHTS is True and settings.immutable_weights is False
    assert settings.cache_built_engines and settings.reuse_cached_engines
    assert settings.pass_through_build_failures is True
    assert isinstance(call["engine_cache"], DiskEngineCache)
    assert call["engine_cache"].engine_cache_dir == str(tmp_path / "torch_tensorrt")
    # precision comes from the graph: autocast stays off, and enabled_precisions is gone in 2.13
    assert _defaults.ENABLE_AUTOCAST is False and settings.enable_autocast is False
    fields = {f.name for f in dataclasses.fields(CompilationSettings)}
    assert "enabled_precisions" not in fields
    # every option we pass is read: a settings field, or one the engine cache reads
    options = ttrt_runtime.compile_options("/cache", 3)
    cache_keys = {"engine_cache_dir", "engine_cache_size", "custom_engine_cache"}
    assert set(options) <= fields | cache_keys, set(options) - fields - cache_keys
    compile_parameters = inspect.signature(torch_tensorrt.dynamo.compile).parameters
    assert set(options) <= set(compile_parameters)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_op_we_emit_has_a_converter(lowered, torch_tensorrt, tmp_path, precision):
    from torch_tensorrt.dynamo.conversion import DYNAMO_CONVERTERS

    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    _compile(model, x, tmp_path, precision=precision)
    (call,) = lowered
    assert _unconverted(call["gm"], DYNAMO_CONVERTERS) == []
    # the graph's own dtypes carry the precision to TensorRT (2.13 has no enabled_precisions)
    convolutions = [n for n in call["gm"].graph.nodes if "convolution" in str(n.target)]
    want = torch.float16 if precision == "fp16" else torch.float32
    assert convolutions and {n.meta["val"].dtype for n in convolutions} == {want}


def test_attention_graph_ops_have_converters(lowered, torch_tensorrt, tmp_path):
    from torch_tensorrt.dynamo.conversion import DYNAMO_CONVERTERS

    model = ViTLike().eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.inference_mode():
        torch.testing.assert_close(_compile(model, x, tmp_path), model(x), rtol=1e-4, atol=1e-4)
    (call,) = lowered
    assert _unconverted(call["gm"], DYNAMO_CONVERTERS) == []


def test_the_registry_check_can_fail(torch_tensorrt):
    """An op without a converter is reported (the check above is not vacuous)."""
    from torch_tensorrt.dynamo.conversion import DYNAMO_CONVERTERS

    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    for node in gm.graph.nodes:
        if node.op == "call_module":
            node.op, node.target = (
                "call_function",
                torch.ops.aten.fake_quantize_per_tensor_affine.default,
            )
    assert _unconverted(gm, DYNAMO_CONVERTERS) == ["aten.fake_quantize_per_tensor_affine.default"]
