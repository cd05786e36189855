"""The Benchmarks page's plots are drawn by bench/ scripts from recorded JSON: the records hold
what the plots and the page need, and the scripts still draw them."""

from __future__ import annotations

import json

import pytest

from bench import bench_mixed_layers, plot_cpu_table
from tests.docs.blocks import REPO

RESULTS = REPO / "bench" / "results"
PNG = b"\x89PNG\r\n\x1a\n"


def test_cpu_table_record_has_every_bar_and_its_provenance(tmp_path):
    rows, title = plot_cpu_table.load_rows(RESULTS / "cpu_table_2026-11-27.json")
    assert "2026-11-27" in title and "EPYC" in title
    assert {(r["model"], r["batch"]) for r in rows} >= {("resnet50", 1), ("bert_base", 8)}
    for row in rows:
        for _, keys, _ in plot_cpu_table.BARS:
            assert any(f"{k}_x_eager" in row for k in keys), (row["model"], keys)
    out = tmp_path / "cpu.png"
    plot_cpu_table.plot(rows, title, out)
    assert out.read_bytes().startswith(PNG)


@pytest.mark.parametrize("name", ["resnet_like", "mobilenet_like"])
def test_mixed_layers_record_draws(name, tmp_path):
    document = json.loads((RESULTS / f"mixed_layers_{name}.json").read_text())
    assert document["command"].startswith("python -m bench.bench_mixed_layers")
    assert document["date"] and document["machine"] and document["layers"]
    assert all(r["precision"] in ("int8", "bf16", "fp16", "fp32") for r in document["layers"])
    out = tmp_path / "mixed.png"
    bench_mixed_layers.plot(document, out)
    assert out.read_bytes().startswith(PNG)
