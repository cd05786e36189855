"""The precision registry (:mod:`embedl_dynamo.precision`): the built-in entries' facts, and a new
precision added as one stage module plus one :func:`register_precision` line, run end to end."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import embedl_dynamo
from embedl_dynamo.backend import as_backend
from embedl_dynamo.graph.capture import capture
from embedl_dynamo.pipeline import run_pipeline
from embedl_dynamo.precision import (
    Precision,
    get_precision,
    precision_names,
    register_precision,
    unregister_precision,
)
from embedl_dynamo.settings import Settings
from tests.models import MobileNetLike

# The whole of a new precision: this module ...
STAGE_MODULE = '''
"""Weights rounded to bf16 and back, computed in fp32 (a dummy precision for the tests)."""

import copy
import operator

import torch


def stage(gm, example_inputs, backend, settings):
    gm = copy.deepcopy(gm)
    names = [str(n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    tensors = [operator.attrgetter(name)(gm) for name in names]
    tensors += [*gm.parameters(), *gm.buffers()]
    layers = []
    for tensor in {id(t): t for t in tensors if isinstance(t, torch.Tensor)}.values():
        if tensor.is_floating_point() and tensor.dim() >= 2:
            tensor.data.copy_(tensor.data.to(torch.bfloat16).to(tensor.dtype))
            layers.append(tuple(tensor.shape))
    gm.meta["bf16_weights"] = settings.precision.name
    record = {"precision": "bf16w", "reason": "weights rounded to bf16"}
    return gm, {"layers": [{"id": str(s), **record} for s in layers]}
'''
# ... and this line.
BF16W = Precision("bf16w", lower=True, stage="bf16_weights_stage:stage")  # judged by the budget


@pytest.fixture
def bf16w(tmp_path, monkeypatch):
    (tmp_path / "bf16_weights_stage.py").write_text(textwrap.dedent(STAGE_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    register_precision(BF16W)
    try:
        yield BF16W
    finally:
        unregister_precision(BF16W.name)
        sys.modules.pop("bf16_weights_stage", None)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), 0).item()


def test_built_in_precisions_and_their_facts():
    weight_only = ("int8_weight_only", "int4_weight_only")
    assert precision_names() == ("fp32", "fp16", "bf16", "int8", "mixed", *weight_only, "fp8")
    facts = {
        n: (p.lower, p.calibrates, p.quantizes, p.per_layer, p.half_dtype, p.qdq_type)
        for n in precision_names()
        if (p := get_precision(n))
    }
    assert facts == {
        "fp32": (False, False, False, False, None, None),
        "fp16": (True, False, False, False, torch.float16, None),
        "bf16": (True, False, False, False, torch.bfloat16, None),
        "int8": (True, True, True, False, None, "int8"),
        "mixed": (True, True, True, True, None, "int8"),
        "int8_weight_only": (True, False, False, False, None, None),
        "int4_weight_only": (True, False, False, False, None, None),
        "fp8": (True, True, True, False, None, "float8e4m3fn"),
    }
    assert get_precision("fp32").load_stage() is None
    assert get_precision("int8").load_stage() is get_precision("mixed").load_stage()


def test_registry_refuses_duplicates_bad_entries_and_removing_built_ins():
    with pytest.raises(ValueError, match="'int8' is already registered"):
        register_precision(Precision("int8"))
    with pytest.raises(ValueError, match="built in and cannot be unregistered"):
        unregister_precision("fp16")
    with pytest.raises(ValueError, match="is not 'module:function'"):
        Precision("fp8", stage="no_colon")
    with pytest.raises(ValueError, match="qdq_type='int8' without quantizes=True"):
        Precision("w8", qdq_type="int8")
    with pytest.raises(ValueError, match="not a floating torch.dtype"):
        Precision("int4", half_dtype=torch.int8)
    with pytest.raises(ValueError, match=r"invalid precision='fp9'; valid values: 'fp32'"):
        get_precision("fp9")
    with pytest.raises(ValueError, match="its stage 'nowhere:stage' cannot be loaded"):
        Precision("fp8", stage="nowhere:stage").load_stage()


def test_a_registered_precision_is_accepted_everywhere_and_forgotten_when_removed(bf16w):
    assert Settings.from_options({"precision": "bf16w"}, env={}).precision is bf16w
    env = {"EMBEDL_DYNAMO_PRECISION": "bf16w"}
    assert Settings.from_options({}, env=env).precision is bf16w
    with pytest.raises(ValueError, match="valid values: 'fp32', .*'mixed', .*'fp8', 'bf16w'"):
        Settings.from_options({"precision": "fp9"}, env={})
    with pytest.raises(ValueError, match="quantize='int8' conflicts with precision='bf16w'"):
        Settings.from_options({"precision": "bf16w", "quantize": "int8"}, env={})
    unregister_precision("bf16w")
    try:
        with pytest.raises(ValueError, match="invalid precision='bf16w'"):
            Settings.from_options({"precision": "bf16w"}, env={})
    finally:
        register_precision(bf16w)


def test_a_registered_precision_runs_through_the_pipeline(bf16w):
    torch.manual_seed(0)
    model = MobileNetLike().eval()
    x = torch.randn(2, 3, 32, 32)
    settings = Settings.from_options({"precision": "bf16w"}, env={})
    result = run_pipeline(capture(model, (x,)), [x], as_backend("tensorrt"), settings)
    assert result.model.meta["bf16_weights"] == "bf16w"
    assert result.report["precision"] == "bf16w" and not result.report["quantized"]
    assert result.report["layers"] and all(
        r["precision"] == "bf16w" for r in result.report["layers"]
    )
    with torch.no_grad():
        (expected,), (got,) = result.float_model(x), result.model(x)  # captured: a tuple out
    assert not torch.equal(got, expected) and _cosine(got, expected) > 0.999


def test_a_registered_precision_runs_through_torch_compile(bf16w, tmp_path):
    torch.manual_seed(0)
    model = MobileNetLike().eval()
    x = torch.randn(2, 3, 32, 32)
    options = {
        "precision": "bf16w",
        "cache_dir": str(tmp_path / "cache"),  # tmp_path holds the stage's module
        "fallback": "raise",
        "runtime": "onnxruntime",
    }
    compiled = torch.compile(model, backend="embedl_tensorrt", options=options)
    with torch.no_grad():
        expected, got = model(x), compiled(x)
    sub = embedl_dynamo.last_report().subgraphs[0]
    assert sub.runtime == "onnxruntime" and not sub.reason
    assert sub.pipeline["precision"] == "bf16w"
    assert _cosine(got, expected) > 0.999
