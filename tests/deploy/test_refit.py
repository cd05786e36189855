"""refit(path, state_dict): new weights into an exported file and its sidecar, without
exporting again. A float file becomes the file an export of the new weights writes; an INT8
file keeps its scales, held to the budget on calibration data or said to be unchecked; the
refitted file passes load()'s integrity check; what cannot be refitted is refused, the file
left as it was."""

from __future__ import annotations

import json
import warnings

import onnx
import pytest
import torch
from onnx import numpy_helper

import embedl_dynamo
from embedl_dynamo.cache.digests import sha256_file
from embedl_dynamo.deploy.integrity import verify_artifact
from embedl_dynamo.deploy.refit import refit
from embedl_dynamo.errors import ExportArgumentError, ExportError, VerificationError
from tests.helpers import DECODER_VOCAB, moved_weights, random_batches, tiny_decoder
from tests.models import ResNetLike, randomize_batchnorm

X = torch.randn(2, 3, 32, 32)
DATA = random_batches((2, 3, 32, 32), 3)


def _model(seed: int) -> ResNetLike:
    torch.manual_seed(seed)
    return randomize_batchnorm(ResNetLike().eval(), seed)


def _export(model, path, precision="fp32", **options):
    data = DATA if precision == "int8" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return embedl_dynamo.export(
            model,
            (X,),
            path,
            backend="onnxruntime",
            precision=precision,
            calibration_data=data,
            options={"accuracy_budget": 0.95, **options},
        )


def _initializers(path) -> dict[str, bytes]:
    model = onnx.load(str(path))
    return {i.name: numpy_helper.to_array(i).tobytes() for i in model.graph.initializer}


def _sidecar(path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


def test_a_float_file_refitted_is_the_file_an_export_of_the_new_weights_writes(tmp_path):
    other = _model(1)
    path = _export(_model(0), tmp_path / "a.onnx")
    assert _sidecar(path)["refit"] == {"model": "model", "reason": None}
    refit(path, other.state_dict())
    expected = _export(other, tmp_path / "b.onnx")
    assert _initializers(path) == _initializers(expected)
    verify_artifact(path)  # load()'s integrity check: the sidecar's digests are the new file's
    with torch.no_grad():
        assert torch.equal(embedl_dynamo.load(path)(X), embedl_dynamo.load(expected)(X))
    record = _sidecar(path)["refit"]
    assert record["initializers"] > 0 and record["scales"] is None


def test_an_int8_file_without_calibration_data_keeps_its_scales_and_says_so(tmp_path):
    other = _model(1)
    path = _export(_model(0), tmp_path / "a.onnx", "int8")
    scales = _sidecar(path)["quantization"]["scales"]
    with pytest.warns(RuntimeWarning, match="activation scales are kept from the export"):
        refit(path, other)  # the module itself: its parameters and buffers
    sidecar = _sidecar(path)
    assert sidecar["refit"]["scales"] == "kept from export, not checked (no calibration_data)"
    assert sidecar["quantization"]["scales"] == scales
    verify_artifact(path)
    with torch.no_grad():
        out, expected = embedl_dynamo.load(path)(X), other(X)
    assert torch.nn.functional.cosine_similarity(out.flatten(), expected.flatten(), 0) > 0.95


def test_an_int8_file_with_calibration_data_is_held_to_its_budget(tmp_path):
    path = _export(_model(0), tmp_path / "a.onnx", "int8")
    refit(path, _model(1).state_dict(), calibration_data=DATA)
    record = _sidecar(path)["refit"]
    assert record["cosine"] >= 0.95 and record["scales"].startswith("kept from export: cosine")


def test_int8_scales_the_new_weights_outgrow_are_refused_and_the_file_kept(tmp_path):
    other = _model(0)
    path = _export(_model(0), tmp_path / "a.onnx", "int8")
    with torch.no_grad():
        other.conv1.weight.mul_(50)  # activations far beyond the calibrated ranges
    before = sha256_file(path), _sidecar(path)
    with pytest.raises(VerificationError, match="with the INT8 scales of its export"):
        refit(path, other.state_dict(), calibration_data=DATA)
    assert (sha256_file(path), _sidecar(path)) == before
    assert not list(tmp_path.glob(".refit-*"))  # nothing staged is left behind


def test_a_weight_of_another_shape_is_refused_by_name(tmp_path):
    path = _export(_model(0), tmp_path / "a.onnx")
    state = _model(1).state_dict()
    state["fc.weight"] = torch.zeros(3, 16)
    before = sha256_file(path)
    with pytest.raises(ExportArgumentError, match=r"weight fc.weight is float32\[3, 16\]"):
        refit(path, state)
    del state["fc.weight"]
    with pytest.raises(ExportArgumentError, match="weight fc.weight is missing"):
        refit(path, state)
    assert sha256_file(path) == before


def test_a_key_the_exported_model_did_not_have_is_refused_by_name(tmp_path):
    """As ``load_state_dict`` refuses an unexpected key: a weight of another architecture,
    which the refit would otherwise leave out of the file."""
    path = _export(_model(0), tmp_path / "a.onnx")
    state = _model(1).state_dict()
    state["fc2.weight"] = torch.zeros(10, 16)
    before = sha256_file(path)
    with pytest.raises(ExportArgumentError, match="fc2.weight .1 in all. is no weight of the"):
        refit(path, state)
    assert sha256_file(path) == before


def test_the_callers_weights_are_left_as_they_were(tmp_path):
    path = _export(_model(0), tmp_path / "a.onnx")
    state = _model(1).state_dict()
    copies = {k: v.clone() for k, v in state.items()}
    refit(path, state)
    assert all(torch.equal(copies[k], state[k]) for k in state)


def test_a_file_changed_since_export_or_without_a_recipe_is_refused(tmp_path):
    path = _export(_model(0), tmp_path / "a.onnx")
    sidecar = _sidecar(path)
    path.with_suffix(".json").write_text(json.dumps({**sidecar, "weight_recipe": None}))
    with pytest.raises(ExportError, match="exported without a weight recipe"):
        refit(path, _model(1).state_dict())
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="does not match the sha256"):
        refit(path, _model(1).state_dict())


class _ScaledLinear(torch.nn.Module):
    """A linear layer over a 0-d constant computed from no input (folded at freezing)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) / torch.sqrt(torch.tensor(8, dtype=torch.float))


def test_a_file_with_a_0d_constant_exports_and_refits(tmp_path):
    """The recipe's replay check compares a 0-d folded constant (DeBERTa's attention scale)."""
    torch.manual_seed(0)
    model, other, x = _ScaledLinear().eval(), _ScaledLinear().eval(), torch.randn(2, 8)
    path = embedl_dynamo.export(model, (x,), tmp_path / "s.onnx", backend="onnxruntime")
    refit(path, other.state_dict())
    torch.testing.assert_close(embedl_dynamo.load(path)(x), other(x), atol=1e-5, rtol=0)


class _OverATable(torch.nn.Module):
    """A weight read as it is, and a table the ONNX exporter computes from a buffer (``2 *
    table``: an initializer of its own, named after no constant) or, with ``from_weight``,
    from the weight itself (twice its first row)."""

    def __init__(self, from_weight: bool = False) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))
        self.register_buffer("table", torch.arange(8.0), persistent=False)
        self.from_weight = from_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift = (self.weight * 2)[0] if self.from_weight else self.table * 2
        return x @ self.weight + shift


def test_a_table_the_exporter_computed_from_unchanged_constants_is_kept(tmp_path):
    """The export recorded which constants the exporter computed the table from (the buffer,
    not a weight): new weights keep it, and the file is the one an export of them writes."""
    torch.manual_seed(0)
    model, other, x = _OverATable().eval(), _OverATable().eval(), torch.randn(2, 8)
    path = embedl_dynamo.export(model, (x,), tmp_path / "a.onnx", backend="onnxruntime")
    assert any(not n.startswith("gm.") and len(v) > 4 for n, v in _initializers(path).items())
    refit(path, other)  # the module: its non-persistent buffer too
    expected = embedl_dynamo.export(other, (x,), tmp_path / "b.onnx", backend="onnxruntime")
    assert _initializers(path) == _initializers(expected)
    with torch.no_grad():
        assert torch.equal(embedl_dynamo.load(path)(x), embedl_dynamo.load(expected)(x))


def test_a_table_the_exporter_computed_from_a_changed_weight_is_refused_by_name(tmp_path):
    torch.manual_seed(0)
    model, other = _OverATable(from_weight=True).eval(), _OverATable(from_weight=True).eval()
    path = embedl_dynamo.export(model, (torch.randn(2, 8),), tmp_path / "a.onnx")
    before = sha256_file(path)
    with pytest.raises(
        ExportError, match=r"computed by the ONNX exporter from \S*weight, which the new"
    ):
        refit(path, other)
    assert sha256_file(path) == before


def _decoder(seed: int) -> torch.nn.Module:
    """A tiny random-init Llama (rotary position embeddings: ``inv_freq``, a non-persistent
    buffer), without a cache; ``seed`` > 0 moves every weight."""
    return moved_weights(tiny_decoder("llama", use_cache=False), seed)


# token ids and an attention mask (without one, transformers' mask code reads the positions
# through aten::diff, which the TorchScript exporter refuses: a file of torch.export, no recipe)
IDS = (
    torch.randint(1, DECODER_VOCAB, (1, 8), generator=torch.Generator().manual_seed(3)),
    torch.ones(1, 8, dtype=torch.long),
)


def _export_decoder(model, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return embedl_dynamo.export(model, IDS, path, backend="onnxruntime")


@pytest.mark.slow  # a second member: tests/dynamo/test_refit.py refits a rotary decoder too
def test_a_rotary_decoder_refits_from_a_state_dict_without_its_non_persistent_buffers(tmp_path):
    """``inv_freq`` is in no ``state_dict`` (non-persistent, as ``load_state_dict`` treats it):
    refit from one keeps the file's value for it, as from the model, bit for bit."""
    other = _decoder(1)
    assert not any(k.endswith("inv_freq") for k in other.state_dict())
    path = _export_decoder(_decoder(0), tmp_path / "a.onnx")
    refit(path, other.state_dict())
    refitted = _initializers(path)
    expected = _export_decoder(other, tmp_path / "b.onnx")
    assert refitted == _initializers(expected)
    refit(path, other)  # the module itself: its non-persistent buffers too
    assert _initializers(path) == refitted
    with torch.no_grad():
        assert torch.equal(embedl_dynamo.load(path)(*IDS)[0], embedl_dynamo.load(expected)(*IDS)[0])


def test_a_state_dict_without_a_persistent_weight_is_refused_naming_the_fix(tmp_path):
    """Only the non-persistent buffers may be left out; and a file whose export recorded no
    ``state_dict`` keys cannot tell them apart: both refused by name, with the fix."""
    path = _export_decoder(_decoder(0), tmp_path / "a.onnx")
    state = _decoder(1).state_dict()
    without = {k: v for k, v in state.items() if k != "model.norm.weight"}
    with pytest.raises(ExportArgumentError, match="model.norm.weight is missing .*model itself"):
        refit(path, without)
    sidecar = _sidecar(path)
    del sidecar["weight_recipe"]["state_dict"]  # as a file exported before they were recorded
    path.with_suffix(".json").write_text(json.dumps(sidecar))
    with pytest.raises(ExportArgumentError, match="rotary_emb.inv_freq is missing .*model itself"):
        refit(path, state)
    refit(path, _decoder(1))


class _ConvBN(torch.nn.Module):
    """A convolution and a BatchNorm whose running variance is a non-persistent buffer: the
    export folds it into the convolution's weight, with the weights."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.bn.register_buffer("running_var", torch.rand(4) + 0.5, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


def test_a_constant_of_a_non_persistent_buffer_and_a_weight_needs_the_model(tmp_path):
    torch.manual_seed(0)
    model, other, x = _ConvBN().eval(), _ConvBN().eval(), torch.randn(2, 3, 8, 8)
    path = embedl_dynamo.export(model, (x,), tmp_path / "a.onnx", backend="onnxruntime")
    before = sha256_file(path)
    with pytest.raises(
        ExportArgumentError, match=r"buffer\(s\) bn.running_var together with weights.*the model"
    ):
        refit(path, other.state_dict())
    assert sha256_file(path) == before
    refit(path, other)
    torch.testing.assert_close(embedl_dynamo.load(path)(x), other(x), atol=1e-5, rtol=0)
