"""The calibration cache: readable JSON, zero forward passes on reuse, keys, corruption."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from embedl_dynamo import quantize
from tests.models import ResNetLike, randomize_batchnorm

_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from embedl_dynamo import quantize
    from embedl_dynamo.quant.int8 import stage
    from tests.models import ResNetLike, randomize_batchnorm

    passes = []  # forward passes per calibration run, counted by wrapping the real function
    real_calibrate = stage.calibrate

    def calibrate(*args, **kwargs):
        passes.append(real_calibrate(*args, **kwargs))
        return passes[-1]

    stage.calibrate = calibrate

    torch.manual_seed(0)
    model = ResNetLike().eval()
    randomize_batchnorm(model)
    data = [torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    calls = []

    def forward_loop(m):
        for batch in data:
            calls.append(1)
            m(batch)

    q = quantize(model, (data[0],), forward_loop=forward_loop, cache_dir=sys.argv[1])
    report = q.meta["embedl_quantization"]
    print(json.dumps({"loop_calls": len(calls), "passes": sum(passes),
                      "from": report["ranges_from"], "out": q(data[0]).sum().item()}))
    """
)


def _run(cache_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env["EMBEDL_DYNAMO_BACKEND"] = "onnxruntime"
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(cache_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fresh processes: about 13 s; ranges read back from the cache in this
# process: test_unsigned_ranges_come_back_from_the_cache_unchanged
def test_second_process_runs_zero_calibration_passes(tmp_path):
    # the loop is keyed by what it feeds: its first two batches are hashed (a probe that stops
    # the loop there), then calibration runs all three
    first = _run(tmp_path)
    assert first["from"] == "calibrated" and first["loop_calls"] == 2 + 3 and first["passes"] == 3
    second = _run(tmp_path)
    assert second == {**first, "from": "cache", "loop_calls": 2, "passes": 0}


def _model_and_data():
    torch.manual_seed(0)
    model = ResNetLike().eval()
    randomize_batchnorm(model)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randn(2, 3, 32, 32, generator=gen) for _ in range(2)]
    return model, data


def _report(model, data, cache_dir, **kwargs):
    q = quantize(model, (data[0],), calibration_data=data, cache_dir=cache_dir, **kwargs)
    return q, q.meta["embedl_quantization"]


def test_entry_is_readable_json_with_a_scale_per_tensor(tmp_path):
    model, data = _model_and_data()
    _, report = _report(model, data, tmp_path, backend="onnxruntime")
    path = Path(report["calibration_cache_file"])
    assert path.suffix == ".json" and tmp_path.resolve() in path.parents
    document = json.loads(path.read_text())
    assert set(document["ranges"]) == set(report["ranges"])
    for entry in document["ranges"].values():
        assert entry["dtype"] == "uint8" and entry["scale"] > 0 and 0 <= entry["zero_point"] <= 255
        assert entry["tensor"]  # the module path it belongs to
    assert document["weights"]  # frozen weight scales, for reading


def test_other_data_or_config_gives_another_key(tmp_path):
    model, data = _model_and_data()
    _, base = _report(model, data, tmp_path, backend="onnxruntime")
    _, same = _report(model, data, tmp_path, backend="onnxruntime")
    assert same["calibration_key"] == base["calibration_key"] and same["ranges_from"] == "cache"
    other_data = [d + 0.5 for d in data]
    _, moved = _report(model, other_data, tmp_path, backend="onnxruntime")
    _, observer = _report(model, data, tmp_path, backend="onnxruntime", observer="percentile")
    _, target = _report(model, data, tmp_path, backend="tensorrt")
    keys = {r["calibration_key"] for r in (base, moved, observer, target)}
    assert len(keys) == 4
    assert all(r["ranges_from"] == "calibrated" for r in (moved, observer, target))


def test_corrupt_entry_is_recalibrated_with_a_warning(tmp_path, caplog):
    model, data = _model_and_data()
    q1, report = _report(model, data, tmp_path, backend="onnxruntime")
    Path(report["calibration_cache_file"]).write_text('{"ranges": ')  # truncated
    with caplog.at_level(logging.WARNING):
        q2, again = _report(model, data, tmp_path, backend="onnxruntime")
    assert again["ranges_from"] == "calibrated" and again["calibration_forward_passes"] == 2
    assert any("corrupt" in r.message or "invalid" in r.message for r in caplog.records)
    assert torch.equal(q1(data[0]), q2(data[0]))
    _, third = _report(model, data, tmp_path, backend="onnxruntime")
    assert third["ranges_from"] == "cache"


def _loop_report(model, loop, cache_dir):
    x = torch.randn(2, 3, 8, 8)
    q = quantize(model, (x,), forward_loop=loop, cache_dir=cache_dir, backend="onnxruntime")
    return q.meta["embedl_quantization"]


def test_a_forward_loop_is_keyed_by_what_it_feeds(tmp_path):
    """Same loop code and container, data rescaled 100x: a different key, not a stale hit."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    data = [torch.randn(2, 3, 8, 8) for _ in range(3)]

    def loop_over(batches):
        def forward_loop(m):
            for b in batches:
                m(b)

        return forward_loop

    first = _loop_report(model, loop_over(data), tmp_path)
    again = _loop_report(model, loop_over(data), tmp_path)
    scaled = _loop_report(model, loop_over([b * 100 for b in data]), tmp_path)
    assert (first["ranges_from"], again["ranges_from"]) == ("calibrated", "cache")
    assert (
        scaled["ranges_from"] == "calibrated"
        and scaled["calibration_key"] != first["calibration_key"]
    )


def test_a_loop_that_cannot_be_fingerprinted_is_not_cached(tmp_path, caplog):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    state = {"calls": 0}

    def flaky_loop(m):  # fails the first time it runs (the fingerprint probe), then works
        state["calls"] += 1
        if state["calls"] == 1:
            raise RuntimeError("loader not ready")
        m(torch.randn(2, 3, 8, 8))

    with caplog.at_level(logging.INFO, logger="embedl_dynamo.quant"):
        report = _loop_report(model, flaky_loop, tmp_path)
    assert report["ranges_from"] == "calibrated" and report["calibration_cache_file"] is None
    assert "cannot be fingerprinted" in caplog.text


def _resign(path: Path, document: dict) -> None:
    """Rewrite an entry and its checksum sidecar, as someone editing the cache would."""
    from embedl_dynamo.cache.store import ArtifactCache

    key = path.name[: -len(".json")]
    ArtifactCache(path.parents[2], path.parents[1].name).put(
        key, json.dumps(document).encode(), ".json"
    )


def test_tampered_scales_with_a_resigned_sidecar_are_recalibrated(tmp_path, caplog):
    """Regression (issue 12 item 9): scales ×100 and a re-signed sidecar were trusted."""
    model, data = _model_and_data()
    q1, report = _report(model, data, tmp_path, backend="onnxruntime")
    path = Path(report["calibration_cache_file"])
    original = json.loads(path.read_text())
    for edit in (
        lambda e: e.update(scale=e["scale"] * 100),  # inconsistent with the stored min/max
        lambda e: e.update(min=-1e12, max=1e12, scale=1e12 * 2 / 255, zero_point=128),  # unbounded
        lambda e: e.update(scale=float("nan")),
    ):
        document = json.loads(json.dumps(original))
        edit(next(iter(document["ranges"].values())))
        _resign(path, document)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            q2, again = _report(model, data, tmp_path, backend="onnxruntime")
        assert again["ranges_from"] == "calibrated", edit
        assert any("invalid" in r.getMessage() for r in caplog.records)
        assert torch.equal(q1(data[0]), q2(data[0]))


def test_unsigned_ranges_come_back_from_the_cache_unchanged(tmp_path):
    """The openvino target stores post-ReLU ranges as uint8 from zero; a second calibration
    reads them back (they pass the cache's consistency check) and builds the same graph."""
    model, data = _model_and_data()
    x = data[0]
    _, first = _report(model, data, tmp_path, backend="openvino")
    q, second = _report(model, data, tmp_path, backend="openvino")
    assert (first["ranges_from"], second["ranges_from"]) == ("calibrated", "cache")
    entries = [json.loads(p.read_text()) for p in tmp_path.rglob("*.json")]
    ranges = [r for e in entries for r in (e.get("ranges") or {}).values()]
    assert {r["dtype"] for r in ranges} == {"uint8", "int8"}
    assert all(r["zero_point"] == 0 for r in ranges)
    assert torch.equal(q(x), _report(model, data, None, backend="openvino")[0](x))
