"""A compiled function saved through PyTorch's ``aot_compile`` and loaded again, in one process
(:mod:`embedl_dynamo.dynamo.saved`; a fresh process in ``test_saved_process.py``): our backend
returns a saveable callable only inside ``aot_compile``, PyTorch's own calls work, and what
PyTorch's guards do not check (the weights, the artifacts, the call's state) is refused in one
line."""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo import SavedFunctionError
from embedl_dynamo.dynamo.entry_points import embedl_onnxruntime
from embedl_dynamo.dynamo.saved import bundle_path, portable_guards
from embedl_dynamo.dynamo.saved_function import FORMAT, SavedFunction, loading
from tests.dynamo.saved_worker import model_and_input


def _save(folder, case="fp32", bundle=False, **options):
    model, x = model_and_input(case)
    path = folder / f"{case}.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = embedl_dynamo.save_compiled(
            model, x, path, backend="embedl_onnxruntime", bundle=bundle, **options
        )
    return model, x, path, fn


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One function saved with its bundle (each test has a cache of its own: the bundle is
    where it loads from) and its output before saving."""
    model, x, path, fn = _save(tmp_path_factory.mktemp("saved"), bundle=True)
    with torch.no_grad():
        expected = fn(x)
    return path, expected


def test_only_aot_compile_gets_a_saveable_callable():
    model, x = model_and_input("fp32")
    seen = []

    def backend(gm, inputs):
        seen.append(embedl_onnxruntime(gm, inputs))
        return seen[-1]

    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
        torch.compile(model.forward, backend=backend, fullgraph=True).aot_compile(((x,), {}))
    assert not isinstance(seen[0], SavedFunction)  # torch.compile: the plain callable
    assert isinstance(seen[1], SavedFunction)


def test_pytorch_own_calls_save_and_load(tmp_path):
    model, x = model_and_input("fp32")
    with torch.no_grad():
        fn = torch.compile(model.forward, backend="embedl_onnxruntime", fullgraph=True)
        fn = fn.aot_compile(((x,), {}))
        expected = fn(model, x)
        fn.save_compiled_function(str(tmp_path / "f.pt"), external_data={"model": model})
    with open(tmp_path / "f.pt", "rb") as f:
        loaded = torch.compiler.load_compiled_function(f, external_data={"model": model})
    torch._dynamo.reset()
    embedl_dynamo.clear_reports()
    with torch.no_grad():
        torch.testing.assert_close(loaded(model, x), expected, rtol=0, atol=0)
    (report,) = embedl_dynamo.last_report()
    assert report.loaded == "loaded" and report.runtime == "onnxruntime"


def test_the_saved_bytes_are_json_data(saved):
    path, _ = saved
    model, x = model_and_input("fp32")
    with loading(None) as loaded, open(path, "rb") as f:
        torch.compiler.load_compiled_function(f, external_data={"model": model})
    (saved,) = loaded
    record = json.loads(SavedFunction.serialize_compile_artifacts(saved))
    assert record["format"] == FORMAT and record["target"] == "onnxruntime"
    conv = next(n for n in record["graph"] if n["op"] == "call_function")
    assert conv["target"] == {"fn": ["torch", "conv2d"]}
    assert conv["value"] == {
        "shape": [2, 8, 8, 8],
        "dtype": "torch.float32",
        "stride": [512, 64, 8, 1],
        "offset": 0,
        "device": "cpu",
    }
    assert [set(a) for a in conv["args"]["tuple"][:3]] == [{"node"}] * 3  # input, weight, bias
    assert conv["args"]["tuple"][3:] == [{"tuple": [1, 1]}, {"tuple": [0, 0]}, {"tuple": [1, 1]}, 1]
    (artifact,) = record["artifacts"]
    assert artifact["part"] == "graph" and len(artifact["digest"]) == 64
    assert record["weights"]["state_names"][0] == "conv1.weight"
    assert record["state"] == {"grad": False, "numerics": {"default_dtype": "torch.float32"}}


def test_load_compiled_skips_the_trace_and_loads_every_artifact(saved):
    path, expected = saved
    model, x = model_and_input("fp32")
    loaded = embedl_dynamo.load_compiled(path, model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # built again instead of loaded would warn
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
    assert loaded.report.loaded == "loaded"


def test_other_weights_are_refused_when_loading(saved):
    path, _ = saved
    other, _ = model_and_input("fp32", seed=1)
    with pytest.raises(SavedFunctionError, match=r"weight conv1\.weight .* other values"):
        embedl_dynamo.load_compiled(path, other)
    with pytest.raises(SavedFunctionError, match="saved from a SmallNet, not a Linear"):
        embedl_dynamo.load_compiled(path, nn.Linear(2, 2))


def test_a_weight_changed_after_loading_is_seen_per_call(saved):
    path, _ = saved
    model, x = model_and_input("fp32")
    loaded = embedl_dynamo.load_compiled(path, model)
    with torch.no_grad():
        loaded(x)
        model.fc.weight.mul_(2)  # in place: the version counter moves
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("grad", "grad mode is on and it was saved with grad off: call it under torch.no_grad"),
        ("inference_mode", "torch.inference_mode\\(\\).*call it under torch.no_grad"),
        ("autocast", "autocast\\(cpu, torch.bfloat16\\).*saved under no autocast"),
        ("inference tensor", "argument 0 is an inference tensor"),
    ],
)
def test_a_call_under_another_state_names_it(saved, state, message):
    path, _ = saved
    model, x = model_and_input("fp32")
    loaded = embedl_dynamo.load_compiled(path, model)
    contexts = {
        "grad": contextlib.nullcontext(),
        "inference_mode": torch.inference_mode(),
        "autocast": torch.autocast("cpu", torch.bfloat16),
        "inference tensor": contextlib.nullcontext(),
    }
    if state == "inference tensor":
        with torch.inference_mode():
            x = x.clone()
    grad = torch.enable_grad() if state == "grad" else torch.no_grad()
    with grad, contexts[state], pytest.raises(SavedFunctionError, match=message):
        loaded(x)


def test_a_missing_or_changed_artifact_is_refused(saved, tmp_path):
    path, _ = saved
    model, _ = model_and_input("fp32")
    with pytest.raises(SavedFunctionError, match="is not in the cache at .*bundle=True"):
        embedl_dynamo.load_compiled(path, model, cache_dir=tmp_path / "empty")
    bundle = shutil.copytree(bundle_path(path), tmp_path / "bundle")
    for meta in bundle.glob("onnx/*/*.onnx.meta.json"):  # as if another build's entries
        record = json.loads(meta.read_text())
        meta.write_text(json.dumps(dict(record, blake3="0" * 64)))
    with pytest.raises(SavedFunctionError, match="holds other bytes than the saved one"):
        embedl_dynamo.load_compiled(path, model, cache_dir=bundle)


def test_a_graph_break_says_what_works(tmp_path):
    class Breaks(nn.Module):
        def forward(self, x):
            print("side effect")  # a graph break
            return x + 1

    with pytest.raises(SavedFunctionError, match="as one graph.*torch.compile\\(model"):
        embedl_dynamo.save_compiled(Breaks(), torch.randn(2), tmp_path / "b.pt")
    with pytest.raises(SavedFunctionError, match="takes an nn.Module.*generate"):
        embedl_dynamo.save_compiled(lambda x: x, torch.randn(2), tmp_path / "b.pt")


def test_int8_not_calibrated_yet_is_refused(tmp_path):
    with pytest.raises(SavedFunctionError, match="INT8 has not calibrated yet"):
        _save(tmp_path, precision="int8", calibration_steps=2)


def test_a_graph_that_trains_is_refused(tmp_path):
    model, x = model_and_input("fp32")
    fn = torch.compile(model.forward, backend="embedl_onnxruntime", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = fn.aot_compile(((x,), {}))  # grad mode on: runs in PyTorch
    with pytest.raises(SavedFunctionError, match="not frozen for inference"):
        fn.save_compiled_function(str(tmp_path / "t.pt"), external_data={"model": model})


def test_an_artifact_the_cache_did_not_store_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_READ_ONLY", "1")  # built, not stored
    with pytest.raises(SavedFunctionError, match="artifact is not in the cache .* read-only"):
        _save(tmp_path)


def test_type_identity_guards_are_not_saved():
    def entry(guard_type, is_global=False):
        return SimpleNamespace(guard_type=guard_type, is_global=is_global, derived_guard_types=())

    entries = [entry("TENSOR_MATCH"), entry("TYPE_MATCH"), entry("ID_MATCH"), entry("X", True)]
    # a class's id is another number in the next process; tensors' shapes and dtypes are not
    assert portable_guards(entries) == [True, False, False, False]


class _CacheWriter(nn.Module):
    """A buffer written in place (a KV cache's ``index_copy_``): state, not a weight."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(6, 4))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, position, self.proj(x))
        return self.cache.sum(0) * 2


def test_a_buffer_the_graph_writes_is_not_a_weight(tmp_path):
    torch.manual_seed(0)
    model, x, first = _CacheWriter().eval(), torch.randn(1, 4), torch.tensor([0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        embedl_dynamo.save_compiled(
            model, (x, first), tmp_path / "w.pt", backend="embedl_onnxruntime", min_subgraph_size=1
        )
    with torch.no_grad():
        model(x, torch.tensor([1]))  # the cache now holds what a first step wrote
        state = model.cache.clone()
        loaded = embedl_dynamo.load_compiled(tmp_path / "w.pt", model)  # not "other values"
        got = loaded(x * 2, torch.tensor([2]))
        model.cache.copy_(state)
        want = model(x * 2, torch.tensor([2]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert loaded.report.runtime == "onnxruntime"


@pytest.mark.slow  # two OpenVINO compiles, a save and a load: CI's slow slice
def test_a_bundle_ships_what_the_runtime_derived_from_its_artifacts(tmp_path):
    """OpenVINO's compiled model of the artifact goes into the bundle beside it, so the first
    start from the bundle imports it instead of compiling the file (it was the most of a
    saved ResNet-50's first call); what another artifact derived stays out."""
    folder = tmp_path / "saved"
    folder.mkdir()
    other, y = model_and_input("fp32", seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(other, backend="embedl_openvino")(y)  # derives an entry of its own
        model, x = model_and_input("fp32")
        path = folder / "fp32.pt"
        embedl_dynamo.save_compiled(model, x, path, backend="embedl_openvino", bundle=True)
    derived = [
        json.loads(p.read_text())["meta"]
        for p in (bundle_path(path) / "openvino_compiled").rglob("*.meta.json")
    ]
    (artifact,) = (bundle_path(path) / "onnx").rglob("*.onnx.meta.json")
    assert [d["derived_from"] for d in derived] == [json.loads(artifact.read_text())["blake3"]]
    loaded = embedl_dynamo.load_compiled(path, model)
    with torch.no_grad():
        loaded(x)
    assert loaded.report.runtime_info["openvino_compiled_model"] == "imported from the cache"
