"""``runtime="auto"`` settled without the contest: the architecture key (a cached decision is
reused by the same architecture with other weights) and the family rule (a large transformer's
float graph takes OpenVINO, built alone, when it builds; a small one is timed)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.backends.tensorrt import BACKEND
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.pipeline import run_pipeline
from embedl_dynamo.precision import get_precision
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from embedl_dynamo.settings import Settings
from embedl_dynamo.tuning import runtime_choice, runtime_rules
from embedl_dynamo.tuning.runtime_rules import architecture_key, graph_family
from tests.helpers import BUILD_COUNTS, assert_close_to_scale
from tests.models import ResNetLike, TransformerEncoderNet, randomize_batchnorm

REAL_RULES = runtime_rules.FAMILY_RULES

pytestmark = pytest.mark.skipif(
    not OpenVINORuntime.is_available(), reason=f"{OpenVINORuntime.missing()}"
)
CANDIDATES = [OnnxRuntime, OpenVINORuntime]  # the rule's leader second: the rule reorders


@pytest.fixture(autouse=True)
def _family_rules(monkeypatch):
    """The library's rules (the conftest turns them off for every other test)."""
    monkeypatch.setattr(runtime_rules, "FAMILY_RULES", REAL_RULES)


def _pipeline(model, x):
    return run_pipeline(capture(model.eval(), (x,)), [x], BACKEND, Settings()).model


def _transformer(seed=0):
    torch.manual_seed(seed)
    x = torch.randn(2, 8, 16)
    return _pipeline(TransformerEncoderNet(), x), x


def _resnet(seed=0):
    torch.manual_seed(seed)
    x = torch.randn(2, 3, 16, 16)
    return _pipeline(randomize_batchnorm(ResNetLike(width=8), seed=seed), x), x


def _auto(gm, x, settings):
    options = runtime_choice.run_options(gm, None, CANDIDATES[0], CANDIDATES, get_precision("fp32"))
    return runtime_choice.fastest(options, [x], settings)


def _no_timing(runtimes, inputs):
    raise AssertionError("settled without timing: nothing may be measured")


def _count_runtime_builds(monkeypatch):
    built: list[str] = []
    for cls in CANDIDATES:
        real = cls.build

        def counting(self, *args, _real=real, **kwargs):
            built.append(self.name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "build", counting)
    return built


def test_families_by_op_mix():
    assert graph_family(_transformer()[0]) == "transformer"
    assert graph_family(_resnet()[0]) is None  # convolutions: no rule, the contest decides


def test_the_architecture_key_ignores_weights_not_shapes():
    (a, x), (b, _) = _resnet(seed=0), _resnet(seed=1)
    assert not torch.equal(next(iter(a.parameters())), next(iter(b.parameters())))
    assert architecture_key(a, [x]) == architecture_key(b, [x])
    assert architecture_key(a, [x]) != architecture_key(a, [torch.randn(4, 3, 16, 16)])
    wider = _pipeline(ResNetLike(width=16), x)
    assert architecture_key(a, [x]) != architecture_key(wider, [x])


def _any_size(monkeypatch):
    """The rules without their size gate, so a graph small enough for a unit test takes them."""
    rules = tuple(dataclasses.replace(r, min_flops=0) for r in REAL_RULES)
    monkeypatch.setattr(runtime_rules, "FAMILY_RULES", rules)


def test_a_small_transformer_is_below_the_rule_and_timed(monkeypatch, tmp_path):
    """Small transformers went to ONNX Runtime when measured: the rule's size gate leaves them
    to the contest."""
    gm, x = _transformer()
    assert 0 < runtime_rules.matmul_flops(gm, [x]) < runtime_rules.TRANSFORMER_MIN_FLOPS
    built = _count_runtime_builds(monkeypatch)
    choice = _auto(gm, x, Settings(cache_dir=tmp_path))  # conftest's stand-in timings
    assert sorted(built) == ["onnxruntime", "openvino"] and choice.timings
    assert "rule" not in choice.note


def test_the_transformer_rule_builds_openvino_alone_and_times_nothing(monkeypatch, tmp_path):
    _any_size(monkeypatch)
    gm, x = _transformer()
    built = _count_runtime_builds(monkeypatch)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
    choice = _auto(gm, x, Settings(cache_dir=tmp_path))
    assert choice.runtime.name == "openvino" and built == ["openvino"]
    assert choice.timings == {} and "by the transformer rule" in choice.note
    assert "not timed" in choice.note
    with torch.no_grad():
        expected = gm(x)
        expected = expected[0] if isinstance(expected, (tuple, list)) else expected
        assert_close_to_scale(choice.runtime.infer(x)[0], expected)


def test_a_rule_leader_that_fails_to_build_leaves_the_others(monkeypatch, tmp_path):
    _any_size(monkeypatch)
    gm, x = _transformer()

    def fails(self, gm, inputs):
        raise RuntimeError("OpenVINO cannot compile it")

    monkeypatch.setattr(OpenVINORuntime, "_build", fails)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
    choice = _auto(gm, x, Settings(cache_dir=tmp_path))
    assert choice.runtime.name == "onnxruntime" and choice.note == "auto: onnxruntime"


def test_no_rule_for_a_conv_net_it_is_timed(monkeypatch, tmp_path):
    _any_size(monkeypatch)
    gm, x = _resnet()
    built = _count_runtime_builds(monkeypatch)
    choice = _auto(gm, x, Settings(cache_dir=tmp_path))  # conftest's stand-in timings
    assert sorted(built) == ["onnxruntime", "openvino"] and choice.timings


@pytest.mark.usefixtures("compile_isolation")
def test_the_same_architecture_with_other_weights_skips_the_contest(monkeypatch, tmp_path):
    """A second compile of a model retrained (other weights, same architecture) finds the
    decision measured for the first: its winner alone is built, nothing is timed."""
    options = {"cache_dir": str(tmp_path)}
    x = torch.randn(2, 3, 16, 16)
    first = randomize_batchnorm(ResNetLike(width=8).eval(), seed=0)
    with torch.no_grad():
        torch.compile(first, backend="embedl_tensorrt", options=options)(x)
    assert "timed fastest here" in embedl_dynamo.last_report()[-1].reason
    torch.manual_seed(1)
    second = randomize_batchnorm(ResNetLike(width=8).eval(), seed=1)
    torch._dynamo.reset()
    BUILD_COUNTS.clear()
    built = _count_runtime_builds(monkeypatch)
    monkeypatch.setattr(runtime_choice, "measure_runtimes", _no_timing)
    with torch.no_grad():
        out = torch.compile(second, backend="embedl_tensorrt", options=options)(x)
        assert_close_to_scale(out, second(x))
    sub = embedl_dynamo.last_report()[-1]
    assert "cached decision for this architecture" in sub.reason
    assert built == [sub.runtime] and BUILD_COUNTS["onnx"] == 1  # new weights: one export
