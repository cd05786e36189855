"""Tests for :func:`embedl_dynamo.export`: the file, its sidecar, verification and the errors."""

from __future__ import annotations

import importlib
import json
import logging

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.deploy.export import export, sidecar_path
from embedl_dynamo.errors import ExportArgumentError, ExportError, VerificationError
from tests.models import ResNetLike

verify_module = importlib.import_module("embedl_dynamo.deploy.verify")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return ResNetLike().eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """A float ResNetLike exported once for the module's tests."""
    root = tmp_path_factory.mktemp("export")
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 32, 32)
    path = export(model, (x,), root / "resnet.onnx", options={"cache_dir": root / "cache"})
    return model, before, x, path


def test_export_writes_a_checked_onnx_file_with_dynamic_batch(exported) -> None:
    _, _, _, path = exported
    onnx.checker.check_model(str(path))
    proto = onnx.load(str(path))
    dim0 = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim0.dim_param == "batch"
    assert len(proto.graph.initializer) > 0  # weights are constants, not graph inputs
    assert [i.name for i in proto.graph.input] == ["input_0"]


def test_export_sidecar_reports_plan_verification_settings_versions(exported) -> None:
    _, _, _, path = exported
    side = json.loads(sidecar_path(path).read_text())
    assert sidecar_path(path).name == "resnet.json"
    assert side["format"] == "embedl_dynamo.export/1"
    assert side["onnx_file"] == "resnet.onnx"
    assert side["backend"]["name"] == "tensorrt"
    assert side["inputs"] == [
        {"name": "input_0", "shape": ["batch", 3, 32, 32], "dtype": "float32"}
    ]
    assert side["outputs"] == [{"name": "output_0", "shape": ["batch", 10], "dtype": "float32"}]
    assert side["plan"]["applied_count"] > 0
    applied = {m["pattern"] for m in side["plan"]["matches"] if m["apply"] or m["applied"]}
    assert any("conv" in p for p in applied), applied
    check = side["verification"]
    assert check["passed"] and check["max_abs_diff"] <= 1e-4
    assert check["batch_sizes"] == [2, 4]  # the example batch and a doubled one (dynamic axis)
    assert side["quantized"] is False and side["quantization"] is None
    assert side["settings"]["dynamic_batch"] is True
    assert side["versions"]["torch"] == torch.__version__
    assert side["versions"]["onnx"] == onnx.__version__


def test_export_does_not_modify_the_model(exported) -> None:
    model, before, _, _ = exported
    assert not model.training
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_exported_file_matches_eager_on_onnxruntime(exported) -> None:
    import onnxruntime as ort

    model, _, _, path = exported
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 3, 32, 32)
    (got,) = session.run(None, {"input_0": x.numpy()})
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_export_is_reachable_from_the_package() -> None:
    assert embedl_dynamo.export is export
    assert callable(embedl_dynamo.load)


def test_verification_mismatch_is_an_error_unless_verify_false(
    tmp_path, monkeypatch, caplog
) -> None:
    real = verify_module.run_onnx

    def _off_by_one(path, args):
        return [o + 1.0 for o in real(path, args)]

    monkeypatch.setattr(verify_module, "run_onnx", _off_by_one)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    opts = {"cache_dir": tmp_path / "cache"}
    with pytest.raises(
        VerificationError, match=r"differs from PyTorch by .*max abs diff 1 .*verify=False"
    ):
        export(model, x, tmp_path / "bad.onnx", options=opts)
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.deploy.export"):
        path = export(model, x, tmp_path / "kept.onnx", options=opts, verify=False)
    assert path.is_file()
    assert "kept because verify=False" in caplog.text
    check = json.loads(sidecar_path(path).read_text())["verification"]
    assert check["passed"] is False and check["max_abs_diff"] == pytest.approx(1.0, abs=1e-5)


def test_verification_compares_dtypes_not_only_values(tmp_path, monkeypatch, caplog) -> None:
    """Regression (issue 39 item 2): a file returning float64 where PyTorch gives float32 (or
    int32 for int64) passed, since only values were compared."""
    real = verify_module.run_onnx
    monkeypatch.setattr(
        verify_module,
        "run_onnx",
        lambda path, args: [o.astype(np.float64) for o in real(path, args)],
    )
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    opts = {"cache_dir": tmp_path / "cache"}
    with pytest.raises(VerificationError, match="dtype float64, PyTorch gives float32"):
        export(model, x, tmp_path / "bad.onnx", options=opts)
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.deploy.export"):
        path = export(model, x, tmp_path / "kept.onnx", options=opts, verify=False)
    assert "dtype float64" in caplog.text and "kept because verify=False" in caplog.text
    assert json.loads(sidecar_path(path).read_text())["verification"]["passed"] is False


class _Positions(nn.Module):
    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        return (mask * 2).cumsum(-1) - 1


def test_an_int32_cumsum_exports_pytorchs_int64(tmp_path) -> None:
    """Regression (issue 39 item 2): the file returned int32 where the sidecar and PyTorch say
    int64."""
    mask = torch.full((2, 5), 2**29, dtype=torch.int32)
    path = export(
        _Positions().eval(), mask, tmp_path / "pos.onnx", options={"cache_dir": tmp_path / "c"}
    )
    declared = onnx.load(str(path)).graph.output[0].type.tensor_type.elem_type
    assert declared == onnx.TensorProto.INT64
    assert json.loads(sidecar_path(path).read_text())["outputs"][0]["dtype"] == "int64"
    (got,) = verify_module.run_onnx(path, (mask,))
    assert torch.equal(torch.from_numpy(got), _Positions()(mask))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "nosuch"}, r"unknown backend 'nosuch'; known backends: .*tensorrt"),
        ({"backend": 3}, r"expected a Backend or a backend name, got 3"),
        ({"quantize": "int4"}, r"invalid quantize='int4'; valid values"),
        ({"options": {"colour": "red"}}, r"unknown embedl_dynamo option\(s\) \['colour'\]"),
        ({"options": {"quantize": "int8"}}, r"pass \['quantize'\] as export\(\) arguments"),
        ({"backend": "lattice", "quantize": "int8"}, r"backend 'lattice' has no INT8"),
    ],
)
def test_bad_arguments_name_the_problem(tmp_path, kwargs, message) -> None:
    model = nn.Linear(4, 2).eval()
    with pytest.raises(ExportError, match=message):
        export(model, torch.randn(1, 4), tmp_path / "m.onnx", **kwargs)
    assert not (tmp_path / "m.onnx").exists()


def test_a_backend_object_is_accepted_as_well_as_its_name(tmp_path) -> None:
    import dataclasses

    from embedl_dynamo.backends.onnxruntime import BACKEND

    custom = dataclasses.replace(BACKEND, name="onnxruntime_custom")
    model = nn.Linear(4, 2).eval()
    path = export(
        model,
        torch.randn(1, 4),
        tmp_path / "m.onnx",
        backend=custom,
        options={"cache_dir": tmp_path / "cache"},
    )
    assert json.loads(sidecar_path(path).read_text())["backend"]["name"] == "onnxruntime_custom"


def test_bad_model_inputs_and_paths_name_the_fix(tmp_path) -> None:
    model = nn.Linear(4, 2)
    x = torch.randn(1, 4)
    with pytest.raises(ExportError, match=r"training mode; call model.eval\(\)"):
        export(model, x, tmp_path / "m.onnx")
    assert model.training  # still the user's choice: export did not switch it
    model.eval()
    with pytest.raises(ExportError, match=r"example_inputs\[1\] is a int"):
        export(model, (x, 3), tmp_path / "m.onnx")
    with pytest.raises(ExportError, match=r"must end in .onnx"):
        export(model, x, tmp_path / "m.pt")
    with pytest.raises(ExportError, match=r"does not exist; create it first"):
        export(model, x, tmp_path / "missing" / "m.onnx")
    with pytest.raises(ExportError, match=r"must be a torch.nn.Module"):
        export(lambda t: t, x, tmp_path / "m.onnx")


def test_graph_break_is_a_clear_error(tmp_path) -> None:
    from tests.models import GraphBreakNet

    with pytest.raises(ExportError, match=r"Export needs one graph"):
        export(
            GraphBreakNet().eval(),
            torch.randn(2, 3, 16, 16),
            tmp_path / "g.onnx",
            options={"cache_dir": tmp_path / "cache"},
        )


def _has_tensorrt() -> bool:
    from embedl_dynamo.runtimes.tensorrt.runtime import TensorRTRuntime

    return TensorRTRuntime.missing() is None


@pytest.mark.skipif(_has_tensorrt(), reason="TensorRT is installed: the error path does not apply")
def test_engine_without_tensorrt_is_a_clear_error(tmp_path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3)).eval()
    with pytest.raises(ExportError, match=r"engine=True needs TensorRT and a CUDA GPU, but .*"):
        export(
            model,
            torch.randn(1, 3, 8, 8),
            tmp_path / "e.onnx",
            engine=True,
            options={"cache_dir": tmp_path / "cache"},
        )


@pytest.mark.tensorrt
@pytest.mark.cuda
@pytest.mark.skipif(not _has_tensorrt(), reason="needs TensorRT >= 10 and a CUDA GPU")
def test_engine_export_builds_and_loads(tmp_path) -> None:  # pragma: no cover - GPU machines
    model = _model()
    x = torch.randn(2, 3, 32, 32)
    path = export(
        model, x, tmp_path / "r.onnx", engine=True, options={"cache_dir": tmp_path / "cache"}
    )
    engine = path.with_suffix(".engine")
    assert engine.is_file()
    loaded = embedl_dynamo.load(engine)
    y = loaded(x.cuda())
    torch.testing.assert_close(y.cpu(), model(x), atol=1e-2, rtol=1e-2)


def _calibration() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 3, 32, 32, generator=g) for _ in range(4)]


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorrt"])
def test_int8_export_has_qdq_scales_and_uses_the_calibration_cache(tmp_path, backend) -> None:
    model = _model()
    x = torch.randn(2, 3, 32, 32)
    opts = {"cache_dir": tmp_path / "cache"}
    path = export(
        model,
        x,
        tmp_path / "q.onnx",
        backend=backend,
        quantize="int8",
        calibration_data=_calibration(),
        options=opts,
    )
    proto = onnx.load(str(path))
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("QuantizeLinear") > 0 and ops.count("DequantizeLinear") > 0
    side = json.loads(sidecar_path(path).read_text())
    assert side["quantized"] is True
    quant = side["quantization"]
    assert quant["scales"] and quant["ranges_from"] == "calibrated"
    assert isinstance(quant["float_layers"], list)
    check = side["verification"]
    assert check["passed"] and check["compared_with"] == "fake-quant PyTorch graph"
    assert check["cosine_to_float"] > 0.98
    # the same model and data again: ranges come from the on-disk calibration cache
    again = export(
        model,
        x,
        tmp_path / "q2.onnx",
        backend=backend,
        quantize="int8",
        calibration_data=_calibration(),
        options=opts,
    )
    assert json.loads(sidecar_path(again).read_text())["quantization"]["ranges_from"] == "cache"


def test_an_int8_file_within_the_accuracy_budget_passes_verification(tmp_path) -> None:
    """Integer kernels round ties their own way: on a large output the max abs difference to
    the fake-quant graph can exceed 5% (BERT-base: 0.235 against 0.227) while the cosine to
    the float model is 0.9986. The file passes on the budget torch.compile uses; a budget it
    misses still fails, and the message gives both numbers."""
    model = _model()
    x = torch.randn(2, 3, 32, 32)
    kwargs = {"quantize": "int8", "calibration_data": _calibration(), "tolerance": 1e-9}
    path = export(model, x, tmp_path / "q.onnx", options={"cache_dir": tmp_path / "c"}, **kwargs)
    check = json.loads(sidecar_path(path).read_text())["verification"]
    assert check["passed"] is True and check["max_abs_diff"] > 1e-9
    strict = {"cache_dir": tmp_path / "c", "accuracy_budget": 0.9999999}
    with pytest.raises(
        VerificationError, match=r"cosine 0\.\d+ to the float model \(accuracy_budget"
    ):
        export(model, x, tmp_path / "strict.onnx", options=strict, **kwargs)


def test_a_failed_verification_leaves_existing_files_untouched(tmp_path, monkeypatch) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 8, 8)
    opts = {"cache_dir": tmp_path / "cache"}
    path = export(model, x, tmp_path / "model.onnx", options=opts)
    before = (path.read_bytes(), sidecar_path(path).read_bytes())
    real = verify_module.run_onnx
    monkeypatch.setattr(verify_module, "run_onnx", lambda p, a: [o + 1.0 for o in real(p, a)])
    with pytest.raises(VerificationError, match=r"untouched"):
        export(nn.Sequential(nn.Conv2d(3, 4, 3)).eval(), x, path, options=opts)
    assert (path.read_bytes(), sidecar_path(path).read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == [
        "model.json",
        "model.onnx",
    ]


def test_export_refuses_to_overwrite_a_json_file_that_is_not_its_sidecar(tmp_path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"learning_rate": 0.1}')
    model = nn.Sequential(nn.Conv2d(3, 4, 3)).eval()
    with pytest.raises(ExportError, match=r"config.json exists and is not an embedl_dynamo"):
        export(model, torch.randn(1, 3, 8, 8), tmp_path / "config.onnx")
    assert config.read_text() == '{"learning_rate": 0.1}'
    assert not (tmp_path / "config.onnx").exists()


class _ClassTokenNet(nn.Module):
    """ViT/DeiT's class token then a concat with the patches; ``pin`` builds the tokens from a
    Python list as long as the batch, which pins it for any tracer."""

    def __init__(self, pin: bool = False) -> None:
        super().__init__()
        self.pin = pin
        self.patch = nn.Conv2d(3, 16, 4, 4)
        self.cls = nn.Parameter(torch.randn(1, 1, 16))
        self.pos = nn.Parameter(torch.randn(1, 5, 16))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        if self.pin:  # a Python list as long as the batch: any tracer fixes its length
            cls = torch.cat([self.cls] * x.shape[0])
        else:
            cls = self.cls.expand(x.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos
        return self.head(tokens[:, 0])


def test_a_batch_1_class_token_exports_with_a_dynamic_batch(tmp_path):
    """Dynamo specialises a size of 1: the batch-1 example is captured at batch 2."""
    model = _ClassTokenNet().eval()
    path = export(model, (torch.randn(1, 3, 8, 8),), tmp_path / "vit.onnx", backend="onnxruntime")
    loaded = embedl_dynamo.load(path)
    for batch in (1, 3):
        y = torch.randn(batch, 3, 8, 8)
        with torch.no_grad():
            torch.testing.assert_close(loaded(y), model(y), atol=1e-4, rtol=1e-4)


def test_a_file_that_fails_at_batch_2_is_an_export_error_naming_the_node(tmp_path, capfd):
    """Regression (issue 12 item 19): a raw ONNX Runtime ``Concat`` error escaped verification.

    A class token built from a Python list as long as the batch is captured at batch 1, so the
    file cannot run batch 2; the error names the node, the batch and the way out, and no ORT
    log line reaches the terminal.
    """
    path = tmp_path / "vit.onnx"
    path.write_bytes(b"keep me")
    with pytest.raises(VerificationError, match=r"batch 2.*Concat.*'/gm/Concat") as info:
        export(
            _ClassTokenNet(pin=True).eval(), (torch.randn(1, 3, 8, 8),), path, backend="onnxruntime"
        )
    assert "dynamic_batch=False" in str(info.value) and "\n" not in str(info.value)
    assert path.read_bytes() == b"keep me"
    assert "onnxruntime" not in capfd.readouterr().err
    export(
        _ClassTokenNet(pin=True).eval(),
        (torch.randn(1, 3, 8, 8),),
        path,
        backend="onnxruntime",
        dynamic_batch=False,
    )
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1


class _ClassToken(nn.Module):
    """A ViT/DeiT-style class token: ``expand(x.shape[0], ...)`` must follow the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1)
        return self.head(tokens[:, 0])


def test_a_class_token_expand_keeps_the_batch_dynamic(tmp_path) -> None:
    model = _ClassToken().eval()
    x = torch.randn(2, 3, 16, 16)
    path = export(model, x, tmp_path / "vit.onnx", options={"cache_dir": tmp_path / "c"})
    loaded = embedl_dynamo.load(path)
    for batch in (1, 2, 5):
        y = torch.randn(batch, 3, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(loaded(y), model(y), atol=1e-4, rtol=1e-4)
    assert not x.__dict__.get("_dynamo_dynamic_indices")  # the caller's tensor is not tagged


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_mixed_measures_on_the_runtime_the_targets_file_is_for(
    backend, tmp_path, monkeypatch
) -> None:
    """``mixed`` times and judges its candidates on the runtime that will run the file:
    OpenVINO for the openvino target (when installed), ONNX Runtime otherwise."""
    from embedl_dynamo.runtimes.registry import runtime_classes

    mixed_precision = importlib.import_module("embedl_dynamo.tuning.mixed_precision")
    seen = []

    def _record(result, inputs, quantizer, settings, axes=None, runtime=None):
        seen.append(runtime)
        return result  # the float graph: what mixed keeps when nothing pays

    monkeypatch.setattr(mixed_precision, "apply_mixed", _record)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    export(
        model,
        x,
        tmp_path / "m.onnx",
        backend=backend,
        precision="mixed",
        options={"cache_dir": tmp_path / "c"},
    )
    openvino = runtime_classes()["openvino"]
    want = (
        openvino
        if backend == "openvino" and openvino.is_available()
        else runtime_classes()["onnxruntime"]
    )
    assert seen == [want]


def test_an_instance_exports_more_times_than_dynamos_recompile_limit(tmp_path) -> None:
    """Regression (issue 23 item 12): the 9th export() of one model instance in a process
    failed with "remove the graph break" (Dynamo's recompile limit on the shared forward)."""
    model = nn.Linear(4, 3).eval()
    limit = torch._dynamo.config.recompile_limit
    for i in range(limit + 2):
        path = export(
            model,
            torch.randn(2, 4),
            tmp_path / f"m{i}.onnx",
            dynamic_batch=False,
            backend="onnxruntime",
            options={"cache_dir": tmp_path / "c"},
        )
        assert path.exists()


def test_bf16_that_onnx_runtime_cannot_run_names_the_missing_kernel(tmp_path) -> None:
    """Regression (issue 23 item 17): the error blamed "a size captured as a constant" and
    suggested dynamic_batch=False; the cause is ONNX Runtime's CPU provider lacking bf16 Conv."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    with pytest.raises(VerificationError) as caught:
        export(
            model,
            torch.randn(2, 3, 16, 16),
            tmp_path / "m.onnx",
            backend="onnxruntime",
            precision="bf16",
            options={"cache_dir": tmp_path / "c"},
        )
    message = str(caught.value)
    assert "no Conv kernel for tensor(bfloat16)" in message and "verify=False" in message
    assert "captured as a constant" not in message
    assert not (tmp_path / "m.onnx").exists()


class _TinyBert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.ln = nn.LayerNorm(32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
        self.fc = nn.Linear(32, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layer(self.ln(self.emb(ids)))[:, 0])


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorrt"])
def test_a_bf16_transformer_names_onnx_runtimes_missing_bf16_kernel(tmp_path, backend) -> None:
    """Regression (issue 39 item 10): the message spoke of opset conversion ("No Adapter From
    Version 18 for Split") and a size captured as a constant."""
    torch.manual_seed(0)
    with pytest.raises(VerificationError) as caught:
        export(
            _TinyBert().eval(),
            torch.randint(0, 50, (2, 8)),
            tmp_path / "m.onnx",
            backend=backend,
            precision="bf16",
            options={"cache_dir": tmp_path / "c"},
        )
    message = str(caught.value)
    assert "no MatMul kernel for tensor(bfloat16)" in message, message
    assert "fp16" in message and "backend='openvino'" in message
    assert "opset" not in message and "captured as a constant" not in message


class _Encoder(nn.Module):
    """Token ids (batch, sequence) to a pooled feature: the sequence axis can vary."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.fc = nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(self.emb(ids))).mean(dim=1)


def test_a_declared_sequence_axis_is_dynamic_in_the_file(tmp_path) -> None:
    """Regression (issue 23 item 18): export could not make a sequence axis dynamic."""
    torch.manual_seed(0)
    model = _Encoder().eval()
    ids = torch.randint(0, 50, (2, 12))
    path = export(
        model,
        (ids,),
        tmp_path / "m.onnx",
        backend="onnxruntime",
        dynamic_shapes=[{1: "seq"}],
        options={"cache_dir": tmp_path / "c"},
    )
    side = json.loads(sidecar_path(path).read_text())
    assert side["inputs"][0]["shape"] == ["batch", "seq"]
    loaded = embedl_dynamo.load(path)
    for length in (5, 20):
        x = torch.randint(0, 50, (3, length))
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=1e-5)


def test_a_static_axis_is_named_when_a_call_changes_it(tmp_path) -> None:
    """Regression (issue 23 item 18): load() failed at another length with a raw ONNX Runtime
    dimension error."""
    model = _Encoder().eval()
    path = export(
        model,
        (torch.randint(0, 50, (2, 12)),),
        tmp_path / "s.onnx",
        backend="onnxruntime",
        options={"cache_dir": tmp_path / "c"},
    )
    with pytest.raises(ValueError, match=r"input 0 axis 1 is static \(12\).*dynamic_shapes"):
        embedl_dynamo.load(path)(torch.randint(0, 50, (3, 20)))


@pytest.mark.parametrize(
    ("shapes", "message"),
    [([{1: "seq"}, None], "2 entries for 1 inputs"), ([{5: "seq"}], "an axis of input 0")],
)
def test_bad_dynamic_shapes_name_the_fix(tmp_path, shapes, message) -> None:
    with pytest.raises(ExportArgumentError, match=message):
        export(
            _Encoder().eval(),
            (torch.randint(0, 50, (2, 12)),),
            tmp_path / "b.onnx",
            dynamic_shapes=shapes,
        )


class _ReadsItsSecondArgumentFirst(nn.Module):
    """Embeds ``ids`` before it reads ``x``: Dynamo takes ``ids`` as its first input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.proj = nn.Embedding(10, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embed(ids)) + x


def test_the_file_takes_the_arguments_in_the_callers_order(tmp_path):
    model = _ReadsItsSecondArgumentFirst().eval()
    x, ids = torch.randn(2, 3, 4), torch.randint(0, 10, (2, 3))
    path = embedl_dynamo.export(model, (x, ids), tmp_path / "m.onnx", backend="onnxruntime")
    loaded = embedl_dynamo.load(path)
    x, ids = torch.randn(5, 3, 4), torch.randint(0, 10, (5, 3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, ids), model(x, ids), rtol=1e-5, atol=1e-5)
