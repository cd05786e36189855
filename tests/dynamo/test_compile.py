"""``torch.compile(model, backend="embedl_*")`` end to end on the CPU (ONNX Runtime)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.runtimes.onnxruntime.runtime import OnnxRuntime
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.helpers import BUILD_COUNTS, assert_close_to_scale
from tests.models import (
    GraphBreakNet,
    MobileNetLike,
    ResNetLike,
    TransformerEncoderNet,
    ViTLike,
    randomize_batchnorm,
)

REPO = Path(__file__).resolve().parents[2]


CASES = {
    "resnet": (ResNetLike, (2, 3, 16, 16)),
    "mobilenet": (MobileNetLike, (2, 3, 16, 16)),
    "vit": (ViTLike, (2, 3, 16, 16)),
    "transformer": (TransformerEncoderNet, (2, 8, 16)),
    "graph_break": (GraphBreakNet, (2, 3, 16, 16)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_architectures_equal_eager(name):
    cls, shape = CASES[name]
    model = randomize_batchnorm(cls().eval())
    x = torch.randn(*shape)
    compiled = torch.compile(model, backend="embedl_tensorrt")
    with torch.no_grad():
        expected = model(x)
        actual = compiled(x)
    assert_close_to_scale(actual, expected)
    report = embedl_dynamo.last_report()
    assert len(report) == (2 if name == "graph_break" else 1)
    assert all(s.status == "compiled" and s.runtime == "onnxruntime" for s in report)
    assert all(s.backend == "tensorrt" for s in report)


def test_report_shows_fusions_and_plan():
    model = randomize_batchnorm(ResNetLike().eval())
    report = embedl_dynamo.explain(model, torch.randn(2, 3, 16, 16))
    (sub,) = report.subgraphs
    assert sub.pipeline["applied_count"] > 0
    applied = [e.id for e in sub.plan.entries if e.apply]
    assert "conv_bn_relu@layer1.0.conv1" in applied
    assert "subgraph 0: compiled on onnxruntime (backend tensorrt" in str(report)


def test_model_is_not_mutated():
    model = randomize_batchnorm(ResNetLike().eval())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        torch.compile(model, backend="embedl_tensorrt")(torch.randn(2, 3, 16, 16))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(isinstance(m, nn.Module) for m in model.modules())
    assert model.conv1.weight.requires_grad


def test_embedl_uses_the_env_selected_backend(monkeypatch):
    monkeypatch.setenv("EMBEDL_DYNAMO_BACKEND", "onnxruntime")
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert_close_to_scale(torch.compile(model, backend="embedl")(x), model(x))
    assert embedl_dynamo.last_report()[0].backend == "onnxruntime"


def test_dynamic_batch_builds_once():
    """Batch 2 builds an artifact with a dynamic batch axis. Batch 3 makes Dynamo recompile with
    a symbolic batch; that graph is the same once frozen (the size input is unused), so its key
    is the same and the artifact is reused. Batches 4, 5, 1 reach no backend at all."""
    model = randomize_batchnorm(ResNetLike().eval())
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad():
        for batch in (2, 3, 4, 5, 1):
            x = torch.randn(batch, 3, 16, 16)
            assert_close_to_scale(compiled(x), model(x))
    assert BUILD_COUNTS["onnx"] == 1
    subgraphs = embedl_dynamo.last_report().subgraphs
    # the static graph, the symbolic-batch recompile, and batch 1 (Dynamo specialises 0/1)
    assert len(subgraphs) == 3
    assert [s.cached for s in subgraphs] == [False, True, True]


class _BatchReshape(nn.Module):
    """Uses the batch size as a value, so the symbolic-batch graph differs from the static one."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x)).mean((2, 3))
        return y + torch.arange(x.shape[0], dtype=y.dtype)[:, None]


def test_dynamic_batch_with_batch_dependent_reshape_builds_twice_then_never():
    model = _BatchReshape().eval()
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    with torch.no_grad():
        for batch in (2, 3, 4, 5):
            x = torch.randn(batch, 3, 8, 8)
            assert_close_to_scale(compiled(x), model(x))
            if batch == 3:
                assert BUILD_COUNTS["onnx"] == 2
    assert BUILD_COUNTS["onnx"] == 2


def test_small_subgraphs_stay_in_pytorch():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        y = torch.compile(model, backend="embedl_tensorrt", options={"min_subgraph_size": 5})(x)
        torch.testing.assert_close(y, model(x))
    (sub,) = embedl_dynamo.last_report()
    assert sub.status == "eager" and "2 ops < min_subgraph_size=5" in sub.reason
    assert not BUILD_COUNTS


def test_training_mode_runs_eager_with_one_warning():
    model = ResNetLike().train()
    x = torch.randn(2, 3, 16, 16)
    reference = ResNetLike().train()
    reference.load_state_dict(model.state_dict())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(model, backend="embedl_tensorrt")(x)
    ours = [w for w in caught if "embedl_tensorrt" in str(w.message)]
    assert len(ours) == 1 and "training mode" in str(ours[0].message)
    torch.testing.assert_close(y, reference(x))
    y.sum().backward()  # gradients still flow: the graph ran in PyTorch
    assert model.conv1.weight.grad is not None
    assert embedl_dynamo.last_report()[0].status == "training"
    assert not BUILD_COUNTS


def test_input_requiring_grad_runs_eager_with_one_warning():
    model = ResNetLike().eval()
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(model, backend="embedl_tensorrt")(x)
    ours = [w for w in caught if "embedl_tensorrt" in str(w.message)]
    assert len(ours) == 1 and "requires grad" in str(ours[0].message)
    y.sum().backward()
    assert x.grad is not None


class _Unsupported(nn.Module):
    """A conv net with ``aten::cummax``, which neither ONNX exporter can take."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return torch.cummax(y.flatten(1), dim=1).values


def test_an_op_without_a_conformance_row_stays_in_pytorch_alone():
    """Partition, don't refuse: ``cummax`` (its row keeps it: the export refuses it) stays in
    PyTorch, the conv, BatchNorm and ReLU before it still run on the runtime, and the report
    says which op stayed and why."""
    model = randomize_batchnorm(_Unsupported().eval())
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close_to_scale(torch.compile(model, backend="embedl_tensorrt")(x), model(x))
    (sub,) = embedl_dynamo.last_report()
    assert sub.status == "partitioned" and sub.runtime != "eager", sub
    assert [k["op"] for k in sub.kept] == ["cummax"]
    assert "the ONNX export refuses it" in sub.kept[0]["reason"]
    (fragment,) = sub.partitions
    assert fragment.runtime == sub.runtime and fragment.ops == 4  # conv, bn, relu, flatten
    assert sub.coverage["ops_on_runtime"] == 4 and sub.coverage["ops"] == 5


def _allow_every_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the graph reach the export (the conformance table keeps cummax, which the export
    refuses, in PyTorch): what follows an export failure."""
    import embedl_dynamo.dynamo.partitioned as partitioned

    monkeypatch.setattr(partitioned, "kept_in_pytorch", lambda gm, runtimes: None)


def test_an_op_the_export_fails_on_stays_in_pytorch_alone_and_is_reported(caplog, monkeypatch):
    """The export of the whole graph fails on cummax: narrowed to it, cummax alone stays in
    PyTorch (the table's row says why) and the rest still runs on a runtime."""
    _allow_every_op(monkeypatch)
    model = randomize_batchnorm(_Unsupported().eval())
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert_close_to_scale(torch.compile(model, backend="embedl_tensorrt")(x), model(x))
    (sub,) = embedl_dynamo.last_report()
    assert sub.status == "partitioned" and sub.runtime != "eager", sub.reason
    assert [k["op"] for k in sub.kept] == ["cummax"]
    assert "running it in PyTorch" not in caplog.text  # the graph did not go to PyTorch


def test_a_failure_narrowing_cannot_place_runs_the_graph_in_pytorch(caplog, monkeypatch):
    """Every part fails alone too (the runtime refuses everything): the whole graph runs in
    PyTorch, the reason names every runtime auto tried, and one warning says it."""
    _allow_every_op(monkeypatch)

    def refused(self, gm, inputs, judge=None):
        raise RuntimeError("this runtime refuses every graph")

    monkeypatch.setattr(OnnxRuntime, "build", refused)
    monkeypatch.setattr(OpenVINORuntime, "build", refused)
    model = randomize_batchnorm(_Unsupported().eval())
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert_close_to_scale(torch.compile(model, backend="embedl_tensorrt")(x), model(x))
    (sub,) = embedl_dynamo.last_report()
    assert sub.status == "eager" and sub.runtime == "eager"
    assert "aten::cummax" in sub.reason and "openvino/onnxruntime failed" in sub.reason
    assert caplog.text.count("running it in PyTorch") == 1


def test_unsupported_op_with_fallback_raise(monkeypatch):
    _allow_every_op(monkeypatch)
    model = _Unsupported().eval()
    compiled = torch.compile(model, backend="embedl_tensorrt", options={"fallback": "raise"})
    with pytest.raises(Exception, match="onnxruntime runtime cannot take this subgraph.*cummax"):
        with torch.no_grad():
            compiled(torch.randn(2, 3, 8, 8))


def test_eager_runtime_runs_the_transformed_graph():
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        y = torch.compile(model, backend="embedl_tensorrt", options={"runtime": "eager"})(x)
    assert_close_to_scale(y, model(x), rtol=1e-5)
    (sub,) = embedl_dynamo.last_report()
    assert sub.runtime == "eager" and sub.status == "compiled" and not BUILD_COUNTS


def _compile_error(options, backend="embedl_tensorrt"):
    compiled = torch.compile(nn.Linear(2, 2).eval(), backend=backend, options=options)
    with torch.no_grad():
        compiled(torch.randn(1, 2))


def test_error_unknown_option():
    with pytest.raises(Exception, match=r"unknown embedl_dynamo option\(s\) \['bogus'\]"):
        _compile_error({"bogus": 1})


def test_error_unknown_value():
    with pytest.raises(Exception, match="invalid runtime='cuda'; valid values"):
        _compile_error({"runtime": "cuda"})


def test_error_unknown_backend():
    with pytest.raises(Exception, match="embedl_nope"):
        _compile_error({}, backend="embedl_nope")

    from embedl_dynamo.dynamo import entry_points as dynamo_backend

    with pytest.raises(AttributeError, match="known: embedl_lattice, embedl_onnxruntime"):
        dynamo_backend.embedl_nope  # noqa: B018


@pytest.mark.parametrize(
    ("runtime", "missing"),
    [("tensorrt", "tensorrt"), ("torch_tensorrt", "torch-tensorrt|torch_tensorrt|CUDA")],
)
def test_error_forced_unavailable_runtime_names_what_is_missing(runtime, missing):
    from embedl_dynamo.runtimes import runtime_classes

    if runtime_classes()[runtime].is_available():
        pytest.skip(f"{runtime} is available here")
    with pytest.raises(Exception, match=rf"runtime '{runtime}' is unavailable: .*({missing})"):
        _compile_error({"runtime": runtime})


def test_error_unknown_env_runtime(monkeypatch):
    monkeypatch.setenv("EMBEDL_DYNAMO_RUNTIME", "gpu")
    with pytest.raises(Exception, match="invalid EMBEDL_DYNAMO_RUNTIME='gpu'"):
        _compile_error({})


def test_env_runtime_and_options_precedence(monkeypatch):
    monkeypatch.setenv("EMBEDL_DYNAMO_RUNTIME", "eager")
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.compile(model, backend="embedl_tensorrt")(x)
        assert embedl_dynamo.last_report()[-1].runtime == "eager"
        torch._dynamo.reset()
        torch.compile(model, backend="embedl_tensorrt", options={"runtime": "onnxruntime"})(x)
        assert embedl_dynamo.last_report()[-1].runtime == "onnxruntime"


_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    sys.path.insert(0, {repo!r})
    from tests.models import ResNetLike, randomize_batchnorm
    imported_early = "embedl_dynamo" in sys.modules
    from tests.helpers import BUILD_COUNTS, count_builds
    count_builds()
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        y = torch.compile(model, backend="embedl_tensorrt")(x)
        err = float((y - model(x)).abs().max() / model(x).abs().max())
    print(json.dumps({{"err": err, "builds": BUILD_COUNTS.get("onnx", 0),
                      "early": imported_early}}))
    """
)


def _run_script(cache_dir: Path) -> subprocess.Popen:
    script = _SCRIPT.format(repo=str(REPO))
    env = {**os.environ, "EMBEDL_DYNAMO_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow  # four fresh interpreters: about 20 s. The lock between builders runs by
# default on threads (tests/cache/test_store.py), a warm second process in test_warm_start.py
def test_fresh_processes_share_one_cache_dir_and_rebuild_a_corrupt_entry(tmp_path):
    """Three fresh interpreters compile at once with no ``import embedl_dynamo`` (the entry point
    loads it): one builds, two wait for its artifact and reuse it. A later process finds the
    artifact cut in half and rebuilds it. (A warm process that builds nothing for every precision:
    ``tests/dynamo/test_warm_start.py``.)"""
    cache = tmp_path / "shared"
    results = [_result(p) for p in [_run_script(cache) for _ in range(3)]]
    assert all(r["err"] < 1e-4 for r in results)
    assert not any(r["early"] for r in results)  # only the entry point loaded embedl_dynamo
    assert sum(r["builds"] for r in results) == 1  # one builder, two waited and reused
    (artifact,) = (cache / "onnx").glob("*/*.onnx")
    artifact.write_bytes(artifact.read_bytes()[: artifact.stat().st_size // 2])
    proc = _run_script(cache)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["builds"] == 1
    assert "is corrupt (size" in err and "rebuilding" in err


def test_warm_cache_skips_the_pipeline_but_plan_stays_reachable(monkeypatch):
    import embedl_dynamo.tuning.precision_form as precision_form

    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.compile(model, backend="embedl_tensorrt")(x)
        cold_plan = str(embedl_dynamo.last_report()[-1].plan)
        torch._dynamo.reset()
        calls = []
        real = precision_form.run_pipeline
        monkeypatch.setattr(
            precision_form, "run_pipeline", lambda *a, **k: calls.append(1) or real(*a, **k)
        )
        assert_close_to_scale(torch.compile(model, backend="embedl_tensorrt")(x), model(x))
    warm = embedl_dynamo.last_report()[-1]
    assert warm.cached and warm.status == "compiled" and not calls
    assert warm.pipeline["applied_count"] > 0
    assert "conv_bn_relu@layer1.0.conv1" in [e.id for e in warm.plan.entries if e.apply]
    assert str(warm.plan) == cold_plan  # the rows came with the alias: the same table
    assert calls == []  # and no pipeline ran for them
    assert BUILD_COUNTS["onnx"] == 1


def test_int8_options_reach_the_quantization_step():
    # Seeded: INT8 error of a random 16x16 net calibrated on 4 random batches is itself random
    # (0.6-4% of the output scale over seeds 0-9, one unseeded CI draw hit 6.4%).
    torch.manual_seed(0)
    model = randomize_batchnorm(ResNetLike().eval())
    data = [torch.randn(4, 3, 16, 16) for _ in range(4)]
    x = torch.randn(2, 3, 16, 16)
    options = {"quantize": "int8", "calibration_data": data}
    with torch.no_grad():
        y = torch.compile(model, backend="embedl_onnxruntime", options=options)(x)
        assert_close_to_scale(y, model(x), rtol=0.05)  # INT8: a few percent of the scale
    (sub,) = embedl_dynamo.last_report()
    assert sub.pipeline["quantized"] is True and sub.runtime == "onnxruntime"


def test_parameters_requiring_grad_in_grad_mode_run_eager_and_backward_works():
    model = ResNetLike().eval()  # parameters require grad, as every fresh model's do
    x = torch.randn(2, 3, 16, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(model, backend="embedl_tensorrt")(x)
    ours = [w for w in caught if "embedl_tensorrt" in str(w.message)]
    assert len(ours) == 1 and "parameter" in str(ours[0].message)
    assert "requires grad" in str(ours[0].message) and "torch.no_grad()" in str(ours[0].message)
    y.sum().backward()  # not silently detached
    assert model.conv1.weight.grad is not None
    assert not BUILD_COUNTS


def _compile_resnet_on(runtime: str, tmp_path: Path) -> tuple[nn.Module, torch.Tensor, dict]:
    """Compile a small ResNet on ``runtime`` with a cache in ``tmp_path``; check its outputs and
    that ``runtime`` ran it. Returns the model, its input and the options."""
    model = randomize_batchnorm(ResNetLike().eval())
    x = torch.randn(2, 3, 16, 16)
    options = {"runtime": runtime, "cache_dir": tmp_path}
    with torch.no_grad():
        assert_close_to_scale(
            torch.compile(model, backend="embedl_tensorrt", options=options)(x), model(x)
        )
    assert embedl_dynamo.last_report()[-1].runtime == runtime
    return model, x, options


def test_a_cold_compile_runs_before_its_artifact_is_written(tmp_path, monkeypatch):
    """ONNX Runtime's session is built from the exported model in memory while a helper thread
    writes the file; the cache entry appears, checksummed, once the write ends. (OpenVINO
    reads the file: maps its weights, faster than parsing them from memory.)"""
    runtime = "onnxruntime"
    import threading

    from embedl_dynamo.cache.store import ArtifactCache
    from embedl_dynamo.onnx.initializers import UnwrittenOnnx

    release, real_write = threading.Event(), UnwrittenOnnx.write
    monkeypatch.setattr(
        UnwrittenOnnx, "write", lambda self, path: release.wait(30) and real_write(self, path)
    )
    model, x, options = _compile_resnet_on(runtime, tmp_path)
    key = embedl_dynamo.last_report()[-1].runtime_info["key"]
    cache = ArtifactCache(tmp_path, "onnx")
    assert cache.get(key, ".onnx") is None  # compiled and ran; the file is still being written
    release.set()
    embedl_dynamo.wait_for_cache_writes(timeout=30)
    assert cache.get(key, ".onnx") is not None  # stored with a verified sha256
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend="embedl_tensorrt", options=options)(x)
    assert embedl_dynamo.last_report()[-1].cached and BUILD_COUNTS["onnx"] == 1


@pytest.mark.parametrize(("runtime", "kept"), [("onnxruntime", 1), ("openvino", 0)])
def test_only_a_runtime_that_builds_from_memory_keeps_the_export_in_memory(
    runtime, kept, tmp_path, monkeypatch
):
    """ONNX Runtime's session reads the export in memory, so its weights are made contiguous
    once for it and the writer; OpenVINO waits for the file, so nothing is copied ahead of the
    writer on the compiling thread."""
    from embedl_dynamo.onnx.initializers import UnwrittenOnnx
    from embedl_dynamo.runtimes.registry import runtime_classes

    if runtime_classes()[runtime].missing():
        pytest.skip(runtime_classes()[runtime].missing())
    calls, real = [], UnwrittenOnnx.make_contiguous
    monkeypatch.setattr(UnwrittenOnnx, "make_contiguous", lambda self: calls.append(real(self)))
    _compile_resnet_on(runtime, tmp_path)
    assert len(calls) == kept


class _BigLinears(nn.Module):
    """Two weights over 1 MiB, which a compile keys before its rewrites and again in its export."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(600, 600), nn.Linear(600, 600)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_a_compile_hashes_each_weight_once(monkeypatch):
    from embedl_dynamo.cache import keys

    hashed, real = [], keys._digest

    def digest(tensor):
        hashed.append(tensor.data_ptr())
        return real(tensor)

    monkeypatch.setattr(keys, "_digest", digest)
    model = _BigLinears().eval()
    x = torch.randn(4, 600)
    compiled = torch.compile(
        model, backend="embedl_onnxruntime", options={"runtime": "onnxruntime"}
    )
    with torch.inference_mode():
        assert_close_to_scale(compiled(x), model(x))
    weights = [model.a.weight.data_ptr(), model.b.weight.data_ptr()]
    assert [hashed.count(w) for w in weights] == [1, 1]  # keyed twice, hashed once


@pytest.mark.parametrize("precision", ["int8", "mixed"])
def test_a_precision_the_target_cannot_place_is_a_configuration_error(precision):
    """Regression (issue 39 item 10): embedl_lattice with int8 warned "failed inside
    embedl_dynamo ... Please report this" and ran in PyTorch."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    compiled = torch.compile(model, backend="embedl_lattice", options={"precision": precision})
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Exception, match=rf"precision='{precision}' needs") as raised:
            compiled(torch.randn(2, 8))
    error = getattr(raised.value, "inner_exception", raised.value)
    assert isinstance(error, embedl_dynamo.ConfigurationError)
    assert "Valid precisions for embedl_lattice: fp32, fp16, bf16" in str(error)
    assert "embedl_onnxruntime" in str(error)
    assert not [w for w in caught if "report" in str(w.message)]
