"""The content-addressed artifact cache: keys, atomic writes, corruption, path safety, locks."""

from __future__ import annotations

import gc
import logging
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import fx, nn

from embedl_dynamo.cache import keys
from embedl_dynamo.cache.files import atomic_write_text, default_cache_dir
from embedl_dynamo.cache.keys import content_key, digests_reused, fingerprint_graph, jsonable
from embedl_dynamo.cache.store import ArtifactCache
from tests.models import ResNetLike


def test_content_key_is_deterministic_and_order_insensitive_for_dicts():
    a = content_key("onnx", {"b": 1, "a": [1, 2]}, torch.float32)
    b = content_key("onnx", {"a": [1, 2], "b": 1}, torch.float32)
    assert a == b and len(a) == 64
    assert content_key("onnx", {"a": [1, 2], "b": 2}, torch.float32) != a


def test_content_key_rejects_unserialisable_parts():
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        content_key(object())


def test_jsonable_is_one_rule_for_keys_and_sidecars():
    import numpy as np

    value = {
        "t": torch.tensor([1.0, 2.0]),
        "a": np.arange(2),
        "n": np.float32(0.5),
        "bad": float("nan"),
        "s": {"b", "a"},
        "shape": torch.Size([1, 3]),
        "dtype": torch.float16,
        "path": Path("/x/y.onnx"),
    }
    assert jsonable(value) == {
        "t": [1.0, 2.0],
        "a": [0, 1],
        "n": 0.5,
        "bad": "nan",
        "s": ["a", "b"],
        "shape": [1, 3],
        "dtype": "torch.float16",
        "path": "/x/y.onnx",
    }
    assert list(jsonable({"b": 1, "a": 2})) == ["b", "a"]  # the caller sorts keys when dumping
    marker = object()
    assert jsonable([marker], default=repr) == [repr(marker)]


def test_fingerprint_covers_weights_and_structure():
    model = ResNetLike().eval()
    gm = fx.symbolic_trace(model)
    first = fingerprint_graph(gm)
    assert fingerprint_graph(fx.symbolic_trace(model)) == first
    with torch.no_grad():
        model.fc.bias[0] += 1e-3
    assert fingerprint_graph(fx.symbolic_trace(model)) != first
    other = fx.symbolic_trace(ResNetLike(num_classes=7).eval())
    assert fingerprint_graph(other) != first


class _TwoBig(nn.Module):
    """Two weights over 1 MiB (hashed on threads), a small one and a plain tensor attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(600, 600), nn.Linear(600, 600)
        self.c = nn.Linear(600, 2)
        self.register_buffer("empty", torch.zeros(0))

    def forward(self, x):
        return self.c(self.b(self.a(x)))  # the empty buffer is hashed all the same


def test_fingerprint_covers_every_byte_of_threaded_weights():
    model = _TwoBig().eval()
    first = fingerprint_graph(fx.symbolic_trace(model))
    assert fingerprint_graph(fx.symbolic_trace(model)) == first
    with torch.no_grad():
        model.b.weight[-1, -1] += 1e-6  # the last byte of the second big weight
    changed = fingerprint_graph(fx.symbolic_trace(model))
    assert changed != first
    with torch.no_grad():  # the two big weights trade places: same bytes, other names
        a, b = model.a.weight.clone(), model.b.weight.clone()
        model.a.weight.copy_(b)
        model.b.weight.copy_(a)
    assert fingerprint_graph(fx.symbolic_trace(model)) not in (first, changed)


def _counted_digests(monkeypatch) -> list[int]:
    """The ``data_ptr`` of every tensor whose bytes are hashed from now on."""
    hashed, real = [], keys._digest

    def digest(tensor):
        hashed.append(tensor.data_ptr())
        return real(tensor)

    monkeypatch.setattr(keys, "_digest", digest)
    return hashed


def test_a_weight_is_hashed_once_per_process_and_keys_are_unchanged(monkeypatch):
    model = _TwoBig().eval()
    hashed = _counted_digests(monkeypatch)
    first = fingerprint_graph(fx.symbolic_trace(model))
    count = len(hashed)
    with digests_reused():
        again = fingerprint_graph(fx.symbolic_trace(model))  # the same tensors: no hashing
    later = fingerprint_graph(fx.symbolic_trace(model))  # a later compile: still none
    assert first == again == later and len(hashed) == count == 6  # 3 weights, 3 biases


def test_a_weight_is_not_hashed_again_through_other_tensor_objects_over_its_memory(monkeypatch):
    # each graph Dynamo hands over is frozen into tensor objects of its own (detached views of
    # the parameters), and those of the first graph are freed before the next is keyed
    model = _TwoBig().eval()
    hashed = _counted_digests(monkeypatch)

    def graph_over_the_same_memory() -> fx.GraphModule:
        other = _TwoBig().eval()
        other.load_state_dict(model.state_dict(), assign=True)
        return fx.symbolic_trace(other)

    first = fingerprint_graph(graph_over_the_same_memory())
    gc.collect()
    assert fingerprint_graph(graph_over_the_same_memory()) == first
    assert len(hashed) == 6  # each weight once
    with torch.no_grad():
        model.a.weight.data.add_(1)  # behind the version counter
    assert fingerprint_graph(graph_over_the_same_memory()) != first
    assert len(hashed) == 7


@pytest.mark.parametrize(
    "write",
    [
        lambda w: w.data.mul_(2),
        lambda w: w.data.copy_(torch.randn_like(w)),
        lambda w: w.data.view(-1)[7].add_(1),  # one element
        lambda w: w.detach().numpy().__setitem__((0, 0), 3.0),  # through numpy
    ],
    ids=["data.mul_", "data.copy_", "one element", "numpy"],
)
def test_a_write_that_keeps_the_version_counter_is_still_hashed_again(monkeypatch, write):
    model = _TwoBig().eval()
    hashed = _counted_digests(monkeypatch)
    first = fingerprint_graph(fx.symbolic_trace(model))
    version = model.b.weight._version
    write(model.b.weight)
    assert model.b.weight._version == version  # invisible to the version counter
    changed = fingerprint_graph(fx.symbolic_trace(model))
    assert changed != first
    assert hashed.count(model.b.weight.data_ptr()) == 2
    assert hashed.count(model.a.weight.data_ptr()) == 1


def test_a_weight_written_in_place_within_the_block_is_hashed_again(monkeypatch):
    model = _TwoBig().eval()
    hashed = _counted_digests(monkeypatch)
    with digests_reused():
        first = fingerprint_graph(fx.symbolic_trace(model))
        with torch.no_grad():
            model.b.weight[-1, -1] += 1e-6  # bumps the version counter
        changed = fingerprint_graph(fx.symbolic_trace(model))
    assert changed != first
    assert hashed.count(model.b.weight.data_ptr()) == 2
    assert hashed.count(model.a.weight.data_ptr()) == 1
    assert changed == fingerprint_graph(fx.symbolic_trace(model))  # as keyed from scratch


def test_an_inference_tensor_has_no_version_and_is_hashed_each_time(monkeypatch):
    with torch.inference_mode():
        model = _TwoBig().eval()  # its weights are inference tensors
    hashed = _counted_digests(monkeypatch)
    with digests_reused():
        first = fingerprint_graph(fx.symbolic_trace(model))
        assert fingerprint_graph(fx.symbolic_trace(model)) == first
    assert len(hashed) == 12


def test_default_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBEDL_DYNAMO_CACHE_DIR", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x"
    monkeypatch.delenv("EMBEDL_DYNAMO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "embedl_dynamo"


@pytest.mark.parametrize(
    "key", ["../../etc/passwd", "ABCDEF0123456789", "0" * 8, "/abs" + "0" * 20]
)
def test_path_refuses_keys_that_are_not_hex(tmp_path, key):
    with pytest.raises(ValueError, match="invalid cache key"):
        ArtifactCache(tmp_path, "onnx").path(key)


@pytest.mark.parametrize("suffix", ["/../x", "../", ".onnx/../../x"])
def test_path_refuses_bad_suffixes(tmp_path, suffix):
    with pytest.raises(ValueError, match="invalid cache suffix"):
        ArtifactCache(tmp_path, "onnx").path("ab" * 16, suffix)


def test_bad_namespace(tmp_path):
    with pytest.raises(ValueError, match="invalid cache namespace"):
        ArtifactCache(tmp_path, "../up")


def test_put_get_roundtrip_and_metadata(tmp_path):
    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("x")
    path = cache.put(key, b"payload", ".onnx", meta={"kind": "onnx"})
    assert path.read_bytes() == b"payload"
    assert cache.get(key, ".onnx") == path
    assert cache.metadata(key, ".onnx") == {"kind": "onnx"}
    assert tmp_path.resolve() in path.parents
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_sidecar", "bad_sidecar"])
def test_corrupt_entry_is_detected_logged_removed_and_rebuilt(tmp_path, caplog, damage):
    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("corrupt", damage)
    path, built = cache.get_or_build(key, lambda p: p.write_bytes(b"0123456789"), ".onnx")
    assert built
    sidecar = path.with_name(path.name + ".meta.json")
    if damage == "truncate":
        path.write_bytes(b"01234")
    elif damage == "flip":
        path.write_bytes(b"0123456780")
    elif damage == "no_sidecar":
        sidecar.unlink()
    else:
        sidecar.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.cache.store"):
        assert cache.get(key, ".onnx") is None
    assert "is corrupt" in caplog.text
    assert not path.exists()
    path, built = cache.get_or_build(key, lambda p: p.write_bytes(b"0123456789"), ".onnx")
    assert built and path.read_bytes() == b"0123456789"


def test_get_or_build_builds_once(tmp_path):
    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("once")
    calls = []

    def build(p):
        calls.append(p)
        p.write_bytes(b"x")

    assert cache.get_or_build(key, build, ".bin")[1] is True
    assert cache.get_or_build(key, build, ".bin")[1] is False
    assert len(calls) == 1


def test_lock_serialises_builders(tmp_path):
    """Two threads building one key: the second waits for the first and reuses its artifact."""
    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("locked")
    calls = []

    def build(p):
        calls.append(1)
        time.sleep(0.2)
        p.write_bytes(b"artifact")

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get_or_build(key, build, ".bin")))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sorted(built for _, built in results) == [False, True]


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "a" / "f.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in path.parent.iterdir()] == ["f.json"]


def test_get_verifying_hashes_while_the_caller_reads_and_confirm_refuses_a_flipped_byte(
    tmp_path, caplog
):
    from embedl_dynamo.errors import CorruptEntryError

    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("verifying")
    path = cache.put(key, b"0123456789", ".onnx")
    found, confirm = cache.get_verifying(key, ".onnx")
    assert found == path
    confirm()  # intact: no error, entry kept
    assert cache.get(key, ".onnx") == path
    path.write_bytes(b"0123456780")  # same size: only the sha256 can tell
    found, confirm = cache.get_verifying(key, ".onnx")
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        confirm()
    assert not path.exists() and cache.get_verifying(key, ".onnx") is None
    cache.put(key, b"0123", ".onnx")
    path.write_bytes(b"01234")  # a size mismatch is found before any hashing
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.cache.store"):
        assert cache.get_verifying(key, ".onnx") is None
    assert "is corrupt (size" in caplog.text


def test_a_checksums_problem_is_told_without_removing_the_entry(tmp_path):
    """A helper thread deriving a file from an entry asks only for the verdict: the reader that
    confirms the entry removes it, not the helper (which could remove the entry rebuilt by then
    under the same key)."""
    from embedl_dynamo.errors import CorruptEntryError

    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("verdict")
    path = cache.put(key, b"0123456789", ".onnx")
    path.write_bytes(b"0123456780")
    _, pending = cache.get_verifying(key, ".onnx")
    assert "checksum mismatch" in pending.problem()
    assert path.exists()  # told, not removed
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        pending()
    assert not path.exists()
    intact = cache.put(key, b"abc", ".onnx")
    assert cache.get_verifying(key, ".onnx")[1].problem() is None and intact.exists()


def test_a_lazy_checksum_hashes_nothing_until_started_or_confirmed(tmp_path, monkeypatch):
    from embedl_dynamo.cache import checksums
    from embedl_dynamo.errors import CorruptEntryError

    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("lazy")
    path = cache.put(key, b"0123456789", ".onnx")
    hashed = []
    real = checksums.file_digest
    monkeypatch.setattr(checksums, "file_digest", lambda p: hashed.append(p) or real(p))
    _, pending = cache.get_verifying(key, ".onnx", start=False)
    del pending  # never read, never hashed
    _, pending = cache.get_verifying(key, ".onnx", start=False)
    time.sleep(0.05)
    assert hashed == []
    pending.start()
    pending.start()  # once
    pending()
    assert hashed == [path]
    path.write_bytes(b"0123456780")
    _, pending = cache.get_verifying(key, ".onnx", start=False)
    pending.start()
    time.sleep(0.2)
    assert path.exists()  # found in the background; removed only by the caller, when it asks
    with pytest.raises(CorruptEntryError, match="checksum mismatch"):
        pending()
    assert not path.exists()


def test_get_or_start_stores_the_entry_when_the_helper_thread_finishes(tmp_path):
    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("background")
    release = threading.Event()

    def start(tmp):
        tmp.write_bytes(b"head")

        def finish():
            release.wait(10)
            with open(tmp, "ab") as f:
                f.write(b"-tail")

        return finish

    path, built, writing = cache.get_or_start(key, start, ".onnx")
    assert built and writing is not None and not writing.done()
    assert cache.get(key, ".onnx") is None  # not stored until written
    waiter = threading.Thread(target=lambda: cache.get_or_build(key, pytest.fail, ".onnx"))
    waiter.start()  # a second builder waits on the key's lock, then finds the entry
    release.set()
    assert writing.result(10) == path and path.read_bytes() == b"head-tail"
    waiter.join(10)
    assert not waiter.is_alive() and cache.get(key, ".onnx") == path
    assert cache.get_or_start(key, pytest.fail, ".onnx") == (path, False, None)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporaries


def test_get_or_start_stores_nothing_when_the_write_fails(tmp_path, caplog):
    cache = ArtifactCache(tmp_path, "onnx")
    key = content_key("background-fails")

    def finish():
        raise OSError(28, "No space left on device")

    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.cache.store"):
        _, built, writing = cache.get_or_start(key, lambda tmp: finish, ".onnx")
        with pytest.raises(OSError, match="No space"):
            writing.result(10)
    assert built and "not stored" in caplog.text and cache.get(key, ".onnx") is None
    path, built, writing = cache.get_or_start(
        key, lambda tmp: tmp.write_bytes(b"x") and None, ".onnx"
    )
    assert built and writing is None and path.read_bytes() == b"x"  # built again, then stored


@pytest.mark.parametrize(
    "attributes", [{"stride": 2}, {"padding": 1}, {"dilation": 2}, {"stride": (1, 2)}]
)
def test_fused_modules_differing_only_in_an_attribute_have_different_keys(attributes):
    """Regression (issue 23 item 6): two convolutions that differ only in stride, padding or
    dilation got one key (FusedConv.extra_repr omits them): a model was served another's file."""
    import embedl_dynamo
    from embedl_dynamo.patterns.common import COMMON_CONVERSION_PATTERNS, COMMON_FUSION_PATTERNS

    patterns = [*COMMON_CONVERSION_PATTERNS, *COMMON_FUSION_PATTERNS]
    keys = []
    for kw in ({}, attributes):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 4, 3, **kw), nn.ReLU()).eval()
        fused = embedl_dynamo.transform(model, (torch.randn(1, 3, 16, 16),), patterns).model
        assert "FusedConv" in {type(m).__name__ for m in fused.modules()}
        keys.append(fingerprint_graph(fused))
    assert keys[0] != keys[1]


def test_weights_that_view_a_flat_vector_at_any_offset_are_keyed_and_reused(monkeypatch):
    # vector_to_parameters leaves each parameter a view of one flat vector, at offsets that are
    # no multiple of 8 bytes: the reuse check must read them there too
    model = nn.Sequential(nn.Linear(7, 9), nn.ReLU(), nn.Linear(9, 3)).eval()
    with torch.no_grad():
        vector = torch.nn.utils.parameters_to_vector(model.parameters())
        torch.nn.utils.vector_to_parameters(vector * 2, model.parameters())
    assert any(p.storage_offset() * 4 % 8 for p in model.parameters())
    hashed = _counted_digests(monkeypatch)
    first = fingerprint_graph(fx.symbolic_trace(model))
    assert fingerprint_graph(fx.symbolic_trace(model)) == first
    assert len(hashed) == 4  # each once
    with torch.no_grad():
        model[0].weight.data.mul_(3)  # behind the version counter, at an odd offset
    assert fingerprint_graph(fx.symbolic_trace(model)) != first
