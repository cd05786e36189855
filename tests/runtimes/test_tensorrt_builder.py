"""The TensorRT engine builder's logic on CPU, against a recording stand-in of the ``tensorrt``
module (the real library needs a GPU): network flags, profile shapes, parser errors."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from embedl_dynamo.graph.dynamic_axes import BATCH, DynamicAxes, batch_axes
from embedl_dynamo.runtimes.registry import runtime_for_file
from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime, build_engine, engine_profile


class _Recorder:
    """Stands in for the TensorRT objects ``build_engine`` touches and records the calls."""

    def __init__(self, inputs: int, parse_ok: bool = True) -> None:
        self.calls: list[tuple] = []
        self.inputs, self.parse_ok = inputs, parse_ok

    def module(self) -> types.SimpleNamespace:
        rec = self

        class Network:
            num_inputs = rec.inputs

            def get_input(self, i):
                return types.SimpleNamespace(name=f"input_{i}")

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                rec.calls.append(("create_network", flags))
                return Network()

            def create_builder_config(self):
                return types.SimpleNamespace(
                    add_optimization_profile=lambda p: rec.calls.append(("add_profile",))
                )

            def create_optimization_profile(self):
                return types.SimpleNamespace(
                    set_shape=lambda name, lo, opt, hi: rec.calls.append(
                        ("set_shape", name, lo, opt, hi)
                    )
                )

            def build_serialized_network(self, network, config):
                return b"engine-bytes"

        class Parser:
            num_errors = 1

            def __init__(self, network, logger):
                pass

            def parse(self, data):
                return rec.parse_ok

            def get_error(self, i):
                return "unsupported op Foo"

        class Logger:
            WARNING = 2

            def __init__(self, level):
                self.level = level

        return types.SimpleNamespace(
            Logger=Logger,
            Builder=Builder,
            OnnxParser=Parser,
            NetworkDefinitionCreationFlag=types.SimpleNamespace(STRONGLY_TYPED=2),
        )


def test_engine_is_strongly_typed_with_the_profile_of_the_declared_dynamic_axes(tmp_path: Path):
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"onnx")
    image, lengths = torch.zeros(3, 4, 8, 8), torch.zeros(5, 2)  # batch 3; a 5-row side input
    axes = batch_axes([image, lengths], (), dynamic_batch=True)
    profile = engine_profile([image, lengths], axes, max_batch=16)
    assert profile == [((1, 4, 8, 8), (3, 4, 8, 8), (16, 4, 8, 8)), ((5, 2), (5, 2), (5, 2))]
    rec = _Recorder(inputs=2)
    assert build_engine(rec.module(), onnx, profile) == b"engine-bytes"
    assert rec.calls[0] == ("create_network", 1 << 2)  # STRONGLY_TYPED, valid on TensorRT 10 and 11
    assert ("set_shape", "input_1", (5, 2), (5, 2), (5, 2)) in rec.calls


def test_builder_errors_name_the_cause(tmp_path: Path):
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"onnx")
    profile = engine_profile([torch.zeros(2, 3)], batch_axes([torch.zeros(2, 3)], (), False))
    with pytest.raises(RuntimeError, match="parser rejected the model: unsupported op Foo"):
        build_engine(_Recorder(inputs=1, parse_ok=False).module(), onnx, profile)
    with pytest.raises(RuntimeError, match="network has 2 inputs but 1 shapes"):
        build_engine(_Recorder(inputs=2).module(), onnx, profile)
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="max_batch=2 is smaller than the example's size 4"):
        engine_profile([x], batch_axes([x], (), True), max_batch=2)


def test_profile_covers_every_dynamic_axis_dynamo_marked():
    """A symbolic sequence axis is dynamic in the engine too, up to max_seq (defaults to 512)."""
    ids, mask = torch.zeros(2, 48, dtype=torch.long), torch.zeros(2, 48)
    axes = DynamicAxes(({0: BATCH, 1: "s0"}, {0: BATCH, 1: "s0"}))
    assert engine_profile([ids, mask], axes) == [((1, 1), (2, 48), (32, 512))] * 2
    # the defaults do not grow with the example: Dynamo's recompile example asks for the same
    wide = torch.zeros(5, 64, dtype=torch.long)
    assert [(lo, hi) for lo, _, hi in engine_profile([wide, wide], axes)] == [
        ((1, 1), (32, 512))
    ] * 2
    assert engine_profile([torch.zeros(40, 600)], DynamicAxes(({0: BATCH, 1: "s0"},)))[0][2] == (
        40,
        600,
    )
    assert engine_profile([ids, mask], axes, max_batch=4, max_seq=128)[0] == (
        (1, 1),
        (2, 48),
        (4, 128),
    )
    with pytest.raises(ValueError, match="max_seq=16 is smaller than the example's size 48"):
        engine_profile([ids, mask], axes, max_seq=16)


def test_load_maps_suffixes_to_runtimes():
    assert runtime_for_file(Path("m.plan")) is TensorRTRuntime
    assert runtime_for_file(Path("m.ONNX")).name == "onnxruntime"
    with pytest.raises(
        ValueError, match=r"known suffixes: \.onnx \(onnxruntime, openvino\), \.engine"
    ):
        runtime_for_file(Path("m.tflite"))
