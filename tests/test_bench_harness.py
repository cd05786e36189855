"""The benchmark harness (``bench/``): one timer, one record, the runner end to end, and docs
tables that are drawn from records and name the command that measures them again."""

from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import plugins
from bench.harness.compare import compare
from bench.harness.docs import PAGES, render_page, update_pages
from bench.harness.record import ROW_KEYS, SCHEMA, Record, validate
from bench.harness.timer import interleaved
from bench.variants import check_names
from bench.variants.ours import parse

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def _record(rows, baseline="eager", suite="cpu_table") -> Record:
    environment = {
        "date": "2026-12-06",
        "command": "python -m bench run cpu_table",
        "commit": None,
        "versions": {"torch": "2.13.0"},
        "cpu": {"model": "x"},
        "machine": "x, 2 CPUs",
    }
    record = Record(suite, environment, baseline=baseline)
    for model, variant, metric, value, unit, params in rows:
        record.add(model, variant, metric, value, unit, params=params)
    return record


@pytest.mark.slow  # a fresh process timing every variant: about 10 s; the harness's parts below
def test_cpu_table_smoke_writes_a_valid_record(tmp_path):
    """``python -m bench run cpu_table --smoke``: a tiny CNN, one round, every kind of variant."""
    out = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", "cpu_table", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(out.read_text())
    validate(document)
    environment = document["environment"]
    assert environment["command"] == f"python -m bench run cpu_table --smoke --out {out}"
    assert {"torch", "onnxruntime", "openvino"} <= set(environment["versions"])
    assert environment["cpu"]["model"] and environment["date"].startswith("20")
    assert re.fullmatch(r"[0-9a-f]{40}", environment["commit"] or "")
    latency = {r["variant"]: r for r in document["rows"] if r["metric"] == "latency"}
    errors = {r["variant"] for r in document["rows"] if r["metric"] == "error"}
    from bench.suites.cpu_table import SMOKE

    assert set(SMOKE) == set(latency) | errors and "eager" in latency and "ours-fp32" in latency
    assert latency["eager"]["ratio"] == 1.0 and latency["eager"]["unit"] == "ms"
    for row in latency.values():
        assert row["value"] > 0 and row["ratio"] == pytest.approx(
            row["value"] / latency["eager"]["value"], rel=2e-3
        )
        assert row["params"] == {"batch": 1} and row["model"] == "tiny_cnn"
    cosines = {r["variant"]: r["value"] for r in document["rows"] if r["metric"] == "cosine"}
    assert cosines["ours-fp32"] > 0.999
    assert "| tiny_cnn | 1 |" in done.stdout


def test_interleaved_rotates_blocks_and_counts_calls():
    calls = []
    fns = {key: (lambda key=key: calls.append(key)) for key in ("a", "b", "c")}
    timings = interleaved(fns, 3, warmup=1, repeat=2, pause_s=0.0)
    rounds = [calls[i : i + 9 : 3] for i in range(0, 27, 9)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert all(len(one) == 2 for key in fns for one in timings.rounds[key])
    assert len(timings.samples("a")) == 6 and timings.median("a") >= 0
    assert len(timings.round_medians("b")) == 3


def test_interleaved_groups_keys_and_takes_external_blocks():
    calls, asked = [], []
    fns = {(v, n): (lambda v=v, n=n: calls.append((v, n))) for v in "xy" for n in (1, 2)}

    def peer(index):
        asked.append(index)
        return {("peer", 1): 0.5} if index < 1 else None  # dies after its first round

    timings = interleaved(
        fns, 3, warmup=0, repeat=1, pause_s=0.0, group=lambda k: k[0], external={"peer": peer}
    )
    assert calls[:4] == [("x", 1), ("x", 2), ("y", 1), ("y", 2)]
    assert calls[4:6] == [("y", 1), ("y", 2)]  # round 1 starts one block later
    assert asked == [0, 1] and timings.samples(("peer", 1)) == [0.5]


def test_interleaved_inner_calls_make_one_sample():
    count = []
    timings = interleaved(
        {"f": lambda: count.append(1)}, 1, warmup=0, repeat=2, inner=50, pause_s=0.0
    )
    assert len(count) == 100 and len(timings.samples("f")) == 2


def test_record_ratios_are_to_the_baseline_of_the_same_params_and_metric():
    record = _record(
        [
            ("m", "eager", "latency", 10.0, "ms", {"batch": 1}),
            ("m", "ours", "latency", 2.5, "ms", {"batch": 1}),
            ("m", "eager", "latency", 40.0, "ms", {"batch": 8}),
            ("m", "ours", "latency", 20.0, "ms", {"batch": 8}),
            ("m", "ours", "cosine", 0.99, "cosine", {"batch": 1}),
            ("m", "peer", "latency", 3.0, "ms", {"batch": 2}),
        ]
    )
    record.fail("m", "broken", "RuntimeError: no", params={"batch": 1})
    record.finish()
    ratios = [r["ratio"] for r in record.rows]
    assert ratios == [1.0, 0.25, 1.0, 0.5, None, None, None]
    validate(record.to_dict())


def test_a_record_round_trips_and_validate_names_the_problem(tmp_path):
    record = _record([("m", "eager", "latency", 1.0, "ms", {})])
    loaded = Record.load(record.write(tmp_path / "r.json"))
    assert loaded.rows == record.rows and loaded.environment == record.environment
    document = record.to_dict()
    with pytest.raises(ValueError, match="schema"):
        validate({**document, "schema": "other"})
    for broken, message in (
        ({k: v for k, v in document["rows"][0].items() if k != "unit"}, "lacks unit"),
        ({**document["rows"][0], "value": math.inf}, "finite number"),
        ({**document["rows"][0], "metric": "error"}, "names its error"),
        ({**document["rows"][0], "suite": "other"}, "of suite 'other'"),
    ):
        with pytest.raises(ValueError, match=message):
            validate({**document, "rows": [broken]})
    with pytest.raises(ValueError, match="environment block lacks commit"):
        validate({**document, "environment": {"date": "d", "command": "c"}})
    assert set(ROW_KEYS) <= set(document["rows"][0]) and document["schema"] == SCHEMA


def test_compare_reads_the_ratios_and_names_environment_differences():
    a = _record(
        [("m", "eager", "latency", 10.0, "ms", {}), ("m", "ours", "latency", 5.0, "ms", {})]
    )
    b = _record(
        [("m", "eager", "latency", 20.0, "ms", {}), ("m", "ours", "latency", 10.1, "ms", {})]
    )
    c = _record(
        [("m", "eager", "latency", 10.0, "ms", {}), ("m", "ours", "latency", 4.0, "ms", {})]
    )
    for record in (a, b, c):
        record.finish()
    b.environment = {**b.environment, "versions": {"torch": "2.14.0"}}
    within = compare(a, b)  # twice as slow a machine, the same ratio
    assert "| m |  | ours | latency | 5 ms | 10.1 ms | 1.010x (ratio) | within noise |" in within
    assert "- torch: 2.13.0 -> 2.14.0" in within
    assert "| 0.800x (ratio) | faster |" in compare(a, c)


def test_names_of_variants_and_models_are_checked():
    assert parse("ours-int4_weight_only@openvino+dynamic") == (
        "int4_weight_only",
        "embedl_openvino",
        True,
    )
    assert parse("ours-fp32") == ("fp32", None, False)
    with pytest.raises(ValueError, match="no variant 'ov_fp32'; known: eager"):
        check_names(["eager", "ov_fp32"])
    from bench import models

    with pytest.raises(ValueError, match="no model 'resnet51'; registered: resnet50"):
        models.build("resnet51")
    assert models.family("zoo:anything") == "zoo" and models.family("bert_base") == "transformer"


def test_every_plugin_declares_what_the_runner_calls():
    for name in plugins.names():
        path = REPO / (plugins.SUITES.get(name) or plugins.PROBES[name]).replace(".", "/")
        tree = ast.parse(Path(f"{path}.py").read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assigned = {
            t.id
            for n in tree.body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        assert ast.get_docstring(tree) and plugins.summary(name), name
        assert {"arguments", "run"} <= defined and {"BASELINE", "__all__"} <= assigned, name
    with pytest.raises(ValueError, match="no suite or probe 'cpu'; suites: cpu_table"):
        plugins.plugin("cpu")


def test_bench_has_one_timing_loop():
    """Only ``bench/harness/timer.py`` reads a clock; everything else times through it."""
    clock = re.compile(r"perf_counter|time\.time\(|monotonic\(|process_time|timeit")
    readers = [
        p.relative_to(REPO).as_posix() for p in BENCH.rglob("*.py") if clock.search(p.read_text())
    ]
    assert readers == ["bench/harness/timer.py"]


def test_docs_tables_are_drawn_from_their_records():
    stale = update_pages(check=True)
    assert not stale, f"run: python -m bench docs ({', '.join(p.name for p in stale)})"
    marked = (
        "<!-- bench:table bench/results/beat_eager/2026-11-27.json -->\nold\n<!-- bench:end -->"
    )
    drawn = render_page(marked)
    assert "Command: `EMBEDL_DYNAMO_CACHE_DIR=$(mktemp -d) python -m bench run beat_eager" in drawn
    assert "| scatter_add 4096x512 | 4.41 | 3.13 | 1.12 | 1.21 |" in drawn and "old" not in drawn


def _tables(text: str) -> list[tuple[int, str]]:
    """(first line, the text since the previous table or heading and the table itself) of each
    Markdown table."""
    found, before, in_table = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("|"):
            if not in_table:
                found.append((number, before))
            in_table = True
            before.append(line)
            continue
        if in_table or line.startswith("#"):
            before = []
        in_table = False
        before.append(line)
    return [(number, "\n".join(lines)) for number, lines in found]


def test_every_benchmark_table_names_the_command_that_measures_it():
    pages = sorted(PAGES.glob("*.md"))
    assert len(pages) >= 6
    for page in pages:
        for line, before in _tables(page.read_text()):
            named = re.findall(r"python\s+-m\s+bench\s+run\s+(\w+)", before)
            where = f"{page.name}:{line}"
            assert named, f"{where}: no `python -m bench run <suite>` before or in this table"
            assert set(named) <= set(plugins.names()), (where, named)
    for page in pages:  # each page but the index opens with a table drawn from a record
        if page.name != "index.md":
            first = re.search(r"<!-- bench:table |\n\|", page.read_text())
            assert first and first.group().startswith("<!--"), page.name
