"""Refit (issue 51, build item 3): new weights into a compiled graph keep its plan, its ONNX
graph, its runtime and INT8's activation scales; only what the weights decide is computed again
and written into the artifact. A float refit gives what a fresh build of the new weights gives
on the same runtime, bit for bit; an INT8 one stays within ``accuracy_budget``, or calibrates
again; what cannot be refitted is built anew with the reason in the report."""

from __future__ import annotations

import copy

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.dynamo import refit as refit_module
from tests.helpers import (
    BUILD_COUNTS,
    DECODER_VOCAB,
    moved_weights,
    random_batches,
    tiny_decoder,
    wait_until_stored,
)
from tests.models import ResNetLike, randomize_batchnorm

X = torch.randn(2, 3, 32, 32)
RUNTIMES = ["onnxruntime", pytest.param("openvino", marks=pytest.mark.slow)]


def _model(seed: int) -> ResNetLike:
    torch.manual_seed(seed)
    return randomize_batchnorm(ResNetLike().eval(), seed)


def _last() -> embedl_dynamo.report.subgraph.SubgraphReport:
    return embedl_dynamo.last_report().subgraphs[-1]


def _compile(model: torch.nn.Module, runtime: str, **options) -> torch.nn.Module:
    return torch.compile(
        model, backend=f"embedl_{runtime}", options={"runtime": runtime, **options}
    )


def _fresh_outputs(model: torch.nn.Module, runtime: str, x: torch.Tensor, **options):
    """A build of ``model``'s weights from scratch: no Dynamo code, no artifact of the others."""
    torch._dynamo.reset()
    with torch.no_grad():
        return _compile(model, runtime, **options)(x)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_new_fp32_weights_are_refitted_bit_for_bit_as_a_fresh_build(runtime, tmp_path):
    model, other = _model(0), _model(1)
    compiled = _compile(model, runtime)
    with torch.no_grad():
        compiled(X)
        wait_until_stored()
        model.load_state_dict(other.state_dict())
        refitted = compiled(X)
    refit = _last().pipeline["refit"]
    assert refit["refitted"] and BUILD_COUNTS["onnx"] == 1  # no export: the artifact refitted
    assert _last().runtime == runtime
    fresh = _fresh_outputs(other, runtime, X, cache_dir=str(tmp_path / "fresh"))
    assert torch.equal(refitted, fresh)


def test_new_int8_weights_keep_the_scales_within_the_budget():
    model, other = _model(0), _model(1)
    data = random_batches((2, 3, 32, 32), 3)
    compiled = _compile(model, "onnxruntime", precision="int8", calibration_data=data)
    with torch.no_grad():
        compiled(X)
        wait_until_stored()
        scales = copy.deepcopy(_last().pipeline["quantization"]["ranges"])
        exports = BUILD_COUNTS["onnx"]  # INT8's and the float one it was timed against
        model.load_state_dict(other.state_dict())
        refitted = compiled(X)
        expected = other(X)
    report = _last()
    assert report.pipeline["refit"]["refitted"] and "kept" in report.pipeline["refit"]["scales"]
    assert report.pipeline["quantization"]["ranges"] == scales  # not calibrated again
    assert report.pipeline["refit"]["cosine"] >= 0.99
    assert BUILD_COUNTS["onnx"] == exports  # no export, no speed comparison
    cosine = torch.nn.functional.cosine_similarity(refitted.flatten(), expected.flatten(), 0)
    assert cosine >= 0.99


def test_int8_scales_that_miss_the_budget_calibrate_again_on_the_same_runtime():
    model = _model(0)
    data = random_batches((2, 3, 32, 32), 3)
    compiled = _compile(model, "onnxruntime", precision="int8", calibration_data=data)
    with torch.no_grad():
        compiled(X)
        wait_until_stored()
        scales = copy.deepcopy(_last().pipeline["quantization"]["ranges"])
        model.conv1.weight.mul_(50)  # activations far beyond the calibrated ranges: clipped
        refitted = compiled(X)
        expected = model(X)
    report = _last()
    assert not report.pipeline["refit"]["refitted"]
    assert "calibrated again" in report.pipeline["refit"]["reason"]
    assert report.runtime == "onnxruntime" and report.pipeline["quantization"]["ranges"] != scales
    cosine = torch.nn.functional.cosine_similarity(refitted.flatten(), expected.flatten(), 0)
    assert cosine >= 0.99


def test_a_weight_of_another_shape_is_built_anew_with_the_reason(monkeypatch):
    """Dynamo's guards retrace a model whose parameter shapes change; a refit that meets one
    anyway (here: the recipe says the weight was compiled at another shape) builds anew."""
    model, other = _model(0), _model(1)
    compiled = _compile(model, "onnxruntime")
    with torch.no_grad():
        compiled(X)
    original = refit_module.refit_source

    def elsewhere(job, args):
        source = original(job, args)
        if source is not None and "fc.weight" in source.recipe.leaves:
            source.recipe.leaves["fc.weight"] = {**source.recipe.leaves["fc.weight"], "shape": [3]}
        return source

    monkeypatch.setattr(refit_module, "refit_source", elsewhere)
    torch._dynamo.reset()
    compiled = _compile(model, "onnxruntime")
    with torch.no_grad():
        compiled(X)
        wait_until_stored()
        model.load_state_dict(other.state_dict())
        out = compiled(X)
        expected = other(X)
    refit = _last().pipeline["refit"]
    assert not refit["refitted"]
    assert "weight fc.weight is float32[10, 16], compiled as float32[3]" in refit["reason"]
    assert "shape or dtype changed" in refit["reason"]
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_a_warm_started_graph_refits_from_the_recipe_its_build_stored():
    model, other = _model(0), _model(1)
    with torch.no_grad():
        _compile(model, "onnxruntime")(X)
        torch._dynamo.reset()
        compiled = _compile(model, "onnxruntime")
        compiled(X)
        wait_until_stored()
        assert _last().loaded and BUILD_COUNTS["onnx"] == 1
        model.load_state_dict(other.state_dict())
        out = compiled(X)
        expected = other(X)
    assert _last().pipeline["refit"]["refitted"] and BUILD_COUNTS["onnx"] == 1
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_the_refit_leaves_the_users_model_and_weights_as_they_were():
    model, other = _model(0), _model(1)
    compiled = _compile(
        model, "onnxruntime", precision="int8", calibration_data=random_batches((2, 3, 32, 32), 2)
    )
    new = {k: v.clone() for k, v in other.state_dict().items()}
    with torch.no_grad():
        compiled(X)
        wait_until_stored()
        model.load_state_dict(new)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        compiled(X)
    assert _last().pipeline["refit"]["refitted"]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(new[k], other.state_dict()[k]) for k in new)


def test_weights_a_file_holds_in_another_form_are_built_anew_with_the_reason():
    """Weight-only int8 stores its codes in a form of its own (not an initializer named after
    the constant): new weights build anew, the report says why, and the answer is right."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-0.5)
    x = torch.randn(4, 64)
    options = {"precision": "int8_weight_only", "accuracy_budget": 0.9}
    compiled = _compile(model.eval(), "onnxruntime", **options)
    with torch.no_grad():
        compiled(x)
        model.load_state_dict(other.state_dict())
        out = compiled(x)
        expected = other(x)
    refit = _last().pipeline["refit"]
    assert not refit["refitted"] and "codes is not an initializer of the file" in refit["reason"]
    assert BUILD_COUNTS["refit"] == 0
    cosine = torch.nn.functional.cosine_similarity(out.flatten(), expected.flatten(), 0)
    assert cosine >= 0.9


def _decoder(seed: int) -> torch.nn.Module:
    """A tiny random-init Llama (rotary position embeddings); ``seed`` > 0 moves every weight."""
    return moved_weights(tiny_decoder("llama"), seed)


IDS = torch.randint(1, DECODER_VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_rotary_decoder_keeps_its_cos_sin_tables_and_refits_bit_for_bit(runtime, tmp_path):
    """The exporter folds ``inv_freq`` times the positions into an initializer of its own; it
    recorded that it came from those two alone, and neither changes with ``load_state_dict``
    (``inv_freq`` is a non-persistent buffer): the table is kept, the weights refitted."""
    model, other = _decoder(0), _decoder(1)
    compiled = _compile(model, runtime)
    with torch.no_grad():
        compiled(IDS)
        wait_until_stored()
        model.load_state_dict(other.state_dict())
        refitted = compiled(IDS).logits
    refit = _last().pipeline["refit"]
    assert refit["refitted"] and BUILD_COUNTS["onnx"] == 1 and BUILD_COUNTS["refit"] == 1
    fresh = _fresh_outputs(other, runtime, IDS, cache_dir=str(tmp_path / "fresh")).logits
    assert torch.equal(refitted, fresh)


@pytest.mark.slow  # in CI's slow slice, beside the other rotary decoder's refit
def test_a_rotary_decoder_whose_frequencies_change_is_built_anew_with_the_reason():
    model = _decoder(0)
    compiled = _compile(model, "onnxruntime")
    with torch.no_grad():
        compiled(IDS)
        wait_until_stored()
        model.model.rotary_emb.inv_freq.mul_(0.5)  # the table the exporter folded changes
        out = compiled(IDS).logits
        expected = model(IDS).logits
    refit = _last().pipeline["refit"]
    assert not refit["refitted"] and "inv_freq" in refit["reason"]
    assert "folded by the exporter" in refit["reason"] and BUILD_COUNTS["onnx"] == 2
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
