"""The Benchmarks page's plots are drawn by ``python -m bench plot`` from recorded results: the
records hold what the plots and the page need, and the suites still draw them."""

from __future__ import annotations

import pytest

from bench.harness.plot import plot
from bench.harness.record import Record
from bench.suites import cpu_table
from tests.docs.blocks import REPO

RESULTS = REPO / "bench" / "results"
PNG = b"\x89PNG\r\n\x1a\n"


def test_cpu_table_record_has_every_bar_and_its_provenance(tmp_path):
    record = Record.load(RESULTS / "cpu_table" / "2026-11-27.json")
    assert record.environment["date"] == "2026-11-27" and "EPYC" in record.environment["machine"]
    rows = record.find(metric="latency")
    cases = {(r["model"], r["params"]["batch"]) for r in rows}
    assert cases >= {("resnet50", 1), ("bert_base", 8)}
    for model, batch in cases:
        for _, variants, _ in cpu_table.BARS:
            found = [
                r
                for v in variants
                for r in record.find(
                    model=model, variant=v, metric="latency", params={"batch": batch}
                )
            ]
            assert any(r["ratio"] for r in found), (model, batch, variants)
    out = tmp_path / "cpu.png"
    plot(record, out)
    assert out.read_bytes().startswith(PNG)


@pytest.mark.parametrize("name", ["resnet_like", "mobilenet_like"])
def test_mixed_layers_record_draws(name, tmp_path):
    record = Record.load(RESULTS / "mixed_layers" / f"2026-11-27-{name}.json")
    assert record.environment["regenerate"].startswith("python -m bench run mixed_layers")
    assert record.environment["date"] and record.environment["machine"] and record.rows
    chosen = [r["info"]["precision"] for r in record.find(metric="float")]
    assert chosen and all(p in ("int8", "bf16", "fp16", "fp32") for p in chosen)
    out = tmp_path / "mixed.png"
    plot(record, out)
    assert out.read_bytes().startswith(PNG)
