"""Keyed tags (issue 51 item 4): with a key, a consistently forged entry is refused, not served."""

from __future__ import annotations

import json
import logging
import secrets
import shutil

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.cache.digests import DIGEST, blake3_digest
from embedl_dynamo.cache.files import ENV_CACHE_READ_ONLY
from embedl_dynamo.cache.keys import content_key
from embedl_dynamo.cache.store import ArtifactCache
from embedl_dynamo.cache.tags import ENV_CACHE_KEY_FILE, TAG, cache_key
from embedl_dynamo.errors import ConfigurationError
from embedl_dynamo.settings import Settings
from tests.helpers import BUILD_COUNTS
from tests.models import TinyConvNet


@pytest.fixture
def keyed(tmp_path, monkeypatch):
    """A cache key in a file, named by the environment."""
    key_file = tmp_path / "cache.key"
    key_file.write_text(secrets.token_hex(32) + "\n")
    monkeypatch.setenv(ENV_CACHE_KEY_FILE, str(key_file))
    return key_file


def _sidecar(path):
    return path.with_name(path.name + ".meta.json")


def _forge(path, data: bytes) -> None:
    """Replace an entry's bytes and rewrite its digest and size to match (tag kept as is)."""
    path.write_bytes(data)
    record = json.loads(_sidecar(path).read_text())
    record.update({DIGEST: blake3_digest(data).hex(), "size": len(data)})
    _sidecar(path).write_text(json.dumps(record))


def test_without_a_key_a_consistent_forgery_is_served(tmp_path):
    # what docs/deployment.md says plainly: the digests catch damage, not a forger
    cache = ArtifactCache(tmp_path / "c", "onnx")
    key = content_key("model")
    path = cache.put(key, b"the real artifact", ".onnx")
    _forge(path, b"a forged artifact")
    assert cache.get(key, ".onnx").read_bytes() == b"a forged artifact"


def test_with_a_key_a_forged_entry_is_refused_removed_and_rebuilt(tmp_path, keyed, caplog):
    cache = ArtifactCache(tmp_path / "c", "onnx")
    key = content_key("model")
    path = cache.put(key, b"the real artifact", ".onnx")
    assert TAG in json.loads(_sidecar(path).read_text())
    assert cache.get(key, ".onnx") == path  # its own tag is accepted
    _forge(path, b"a forged artifact")
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.cache"):
        assert cache.get(key, ".onnx") is None
    assert "no valid tag" in caplog.text and not path.exists()
    rebuilt, built = cache.get_or_build(key, lambda p: p.write_bytes(b"the real artifact"), ".onnx")
    assert built and cache.get(key, ".onnx") == rebuilt


def test_a_tagged_entry_moved_under_another_key_is_refused(tmp_path, keyed):
    # re-pointing: another model's valid entry (file and sidecar, its tag intact) copied in
    cache = ArtifactCache(tmp_path / "c", "subgraph")
    mine, theirs = content_key("mine"), content_key("theirs")
    path = cache.put(mine, b'{"onnx_key": "mine"}', ".json")
    other = cache.put(theirs, b'{"onnx_key": "theirs"}', ".json")
    shutil.copyfile(other, path)
    shutil.copyfile(_sidecar(other), _sidecar(path))
    assert cache.get(mine, ".json") is None
    assert cache.get(theirs, ".json") == other


def test_metadata_is_covered_by_the_tag(tmp_path, keyed):
    cache = ArtifactCache(tmp_path / "c", "onnxruntime_optimized")
    key = content_key("derived")
    path = cache.put(key, b"graph", ".onnx", meta={"derived": True, "kind": "x"})
    record = json.loads(_sidecar(path).read_text())
    record["meta"]["kind"] = "y"
    _sidecar(path).write_text(json.dumps(record))
    assert cache.get(key, ".onnx") is None


def test_a_read_only_cache_built_without_the_key_is_refused_with_one_warning(
    tmp_path, monkeypatch, caplog
):
    cache = ArtifactCache(tmp_path / "c", "onnx")
    keys = [content_key("entry", i) for i in range(3)]
    paths = [cache.put(k, b"untagged", ".onnx") for k in keys]
    key_file = tmp_path / "cache.key"
    key_file.write_text(secrets.token_hex(32))
    monkeypatch.setenv(ENV_CACHE_KEY_FILE, str(key_file))
    monkeypatch.setenv(ENV_CACHE_READ_ONLY, "1")
    shipped = ArtifactCache(tmp_path / "c", "onnx")
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.cache"):
        assert all(shipped.get(k, ".onnx") is None for k in keys)
        path, built = shipped.get_or_build(keys[0], lambda p: p.write_bytes(b"x"), ".onnx")
    refused = [r for r in caplog.records if "no valid tag" in r.getMessage()]
    assert len(refused) == 1 and ENV_CACHE_KEY_FILE in refused[0].getMessage()
    assert all(p.exists() for p in paths)  # read-only: refused, never removed
    assert built and (tmp_path / "c") not in path.parents


def test_a_tagged_cache_is_read_without_a_key(tmp_path, keyed, monkeypatch):
    cache = ArtifactCache(tmp_path / "c", "onnx")
    key = content_key("model")
    path = cache.put(key, b"artifact", ".onnx")
    monkeypatch.delenv(ENV_CACHE_KEY_FILE)
    assert cache.get(key, ".onnx") == path


BAD_KEYS = [(None, "cannot read the cache key"), ("abc", "not a 32-byte key")]


@pytest.mark.parametrize(("content", "message"), [*BAD_KEYS, ("zz" * 32, "not a 32-byte key")])
def test_a_bad_key_file_stops_the_compile_with_a_clear_error(
    tmp_path, monkeypatch, content, message
):
    key_file = tmp_path / "cache.key"
    if content is not None:
        key_file.write_text(content)
    monkeypatch.setenv(ENV_CACHE_KEY_FILE, str(key_file))
    with pytest.raises(ConfigurationError, match=rf"invalid {ENV_CACHE_KEY_FILE}=.*{message}"):
        Settings.from_options({"cache_dir": tmp_path / "c"})
    assert cache_key({}) is None


def test_a_keyed_cache_warm_starts_and_refuses_a_re_signed_alias(tmp_path, keyed, caplog):
    """End to end: every entry a compile writes is tagged (a warm start loads them all), and
    an alias re-pointed at another model's artifact, its digest rewritten, is refused."""
    model, other = TinyConvNet().eval(), TinyConvNet().eval()
    x = torch.randn(2, 3, 8, 8)

    def run(module, cache):
        torch._dynamo.reset()
        options = {"cache_dir": cache}
        compiled = torch.compile(module, backend="embedl_onnxruntime", options=options)
        with torch.no_grad():
            out = compiled(x)
        embedl_dynamo.wait_for_cache_writes()
        return out

    run(model, tmp_path / "c")
    run(other, tmp_path / "c")
    BUILD_COUNTS.clear()
    run(model, tmp_path / "c")
    assert embedl_dynamo.last_report().subgraphs[-1].loaded and not BUILD_COUNTS["onnx"]
    aliases = [p for p in (tmp_path / "c" / "subgraph").glob("*/*.json") if ".meta." not in p.name]
    documents = [json.loads(p.read_text()) for p in aliases]
    assert len(aliases) == 2 and documents[0]["onnx_key"] != documents[1]["onnx_key"]
    _forge(aliases[0], json.dumps({**documents[0], "onnx_key": documents[1]["onnx_key"]}).encode())
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        run(model, tmp_path / "c")
        run(other, tmp_path / "c")
    assert any("no valid tag" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        assert torch.allclose(run(model, tmp_path / "c"), model(x), atol=1e-4)
