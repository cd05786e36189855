"""A bad or unusable cache never stops a compile and is never trusted: refuse, log, rebuild."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

import embedl_dynamo
from embedl_dynamo.cache.digests import DIGEST, blake3_digest
from tests.helpers import BUILD_COUNTS, assert_close_to_scale
from tests.models import TinyConvNet

X = torch.randn(2, 3, 8, 8)


def _compile_and_check(model: nn.Module, cache: Path) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="embedl_onnxruntime", options={"cache_dir": cache})
    with torch.no_grad():
        assert_close_to_scale(compiled(X), model(X))
    embedl_dynamo.wait_for_cache_writes()  # the tests below edit the stored files


def _resign(path: Path) -> None:
    """Rewrite an entry's checksum sidecar so it matches the (tampered) file."""
    meta = path.with_name(path.name + ".meta.json")
    record = json.loads(meta.read_text())
    record.update({DIGEST: blake3_digest(path.read_bytes()).hex(), "size": path.stat().st_size})
    meta.write_text(json.dumps(record))


def test_a_symlinked_entry_is_refused_and_rebuilt(tmp_path, caplog):
    model = TinyConvNet().eval()
    _compile_and_check(model, tmp_path / "c")
    (onnx,) = (tmp_path / "c" / "onnx").glob("*/*.onnx")
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(onnx.read_bytes())
    onnx.unlink()
    onnx.symlink_to(outside)
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        _compile_and_check(model, tmp_path / "c")
    assert any("symbolic link" in r.getMessage() for r in caplog.records)
    assert (
        not onnx.is_symlink() and embedl_dynamo.last_report().subgraphs[-1].runtime == "onnxruntime"
    )


def test_an_alias_naming_a_non_hex_key_is_refused(tmp_path, caplog):
    model = TinyConvNet().eval()
    _compile_and_check(model, tmp_path / "c")
    (alias,) = [p for p in (tmp_path / "c" / "subgraph").glob("*/*.json") if ".meta." not in p.name]
    data = json.loads(alias.read_text())
    data["onnx_key"] = "../../../../etc/passwd"
    alias.write_text(json.dumps(data))
    _resign(alias)
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        _compile_and_check(model, tmp_path / "c")
    assert any("malformed subgraph alias" in r.getMessage() for r in caplog.records)


def test_an_unusable_cache_directory_compiles_without_a_cache_and_warns_once(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    model = TinyConvNet().eval()
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        _compile_and_check(model, blocker)
        _compile_and_check(model, blocker)
    warned = [r for r in caplog.records if "is unusable" in r.getMessage()]
    assert len(warned) == 1
    assert embedl_dynamo.last_report().subgraphs[-1].runtime == "onnxruntime"


def test_a_bad_entry_with_a_matching_sidecar_is_replaced_not_reused(tmp_path, caplog):
    model = TinyConvNet().eval()
    _compile_and_check(model, tmp_path / "c")
    (onnx,) = (tmp_path / "c" / "onnx").glob("*/*.onnx")
    other = TinyConvNet().eval()  # other weights: a valid ONNX file that gives wrong answers
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(other, backend="embedl_onnxruntime", options={"cache_dir": tmp_path / "o"})(X)
    embedl_dynamo.wait_for_cache_writes()
    (wrong,) = (tmp_path / "o" / "onnx").glob("*/*.onnx")
    onnx.write_bytes(wrong.read_bytes())
    _resign(onnx)
    BUILD_COUNTS.clear()
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        _compile_and_check(model, tmp_path / "c")
    assert any("replacing it" in r.getMessage() for r in caplog.records)
    assert BUILD_COUNTS["onnx"] == 1 and onnx.read_bytes() != wrong.read_bytes()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        _compile_and_check(model, tmp_path / "c")  # the replacement is trusted from now on
    assert not caplog.records and BUILD_COUNTS["onnx"] == 1


def test_exported_files_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = embedl_dynamo.export(
            TinyConvNet().eval(), X, tmp_path / "m.onnx", options={"cache_dir": tmp_path / "c"}
        )
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert oct(path.with_suffix(".json").stat().st_mode & 0o777) == oct(0o644)


def test_a_cached_artifact_with_a_flipped_byte_is_caught_on_a_warm_start(tmp_path, caplog):
    model = TinyConvNet().eval()
    _compile_and_check(model, tmp_path / "c")
    (onnx,) = (tmp_path / "c" / "onnx").glob("*/*.onnx")
    data = bytearray(onnx.read_bytes())
    data[-1] ^= 0xFF  # the last weight byte: the file still loads, its sidecar size matches
    onnx.write_bytes(bytes(data))
    BUILD_COUNTS.clear()
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo"):
        _compile_and_check(model, tmp_path / "c")
    assert any("checksum mismatch" in r.getMessage() for r in caplog.records)
    assert BUILD_COUNTS["onnx"] == 1 and onnx.read_bytes() != bytes(data)


def test_builds_without_a_cache_leave_no_directory_behind(tmp_path):
    # an unusable cache directory builds into temporary directories: removed at exit
    code = (
        "from embedl_dynamo.cache.files import build_without_cache\n"
        "write = lambda path: path.write_bytes(b'x') and None\n"
        "a, b = build_without_cache('m.onnx', write), build_without_cache('m.onnx', write)\n"
        "assert a != b and a.parent.parent == b.parent.parent and a.read_bytes() == b'x'\n"
        "print(a.parent.parent)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == tmp_path
    assert list(tmp_path.iterdir()) == []
