"""Embedding tables under the weight-only precisions
(:mod:`embedl_dynamo.quant.weight_only.embedding`): which lookups become per-row int8 and why
the others keep their float table, the numbers they compute, and the ONNX file and sessions
made of them."""

from __future__ import annotations

import expecttest
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto
from torch import fx, nn

from embedl_dynamo.backend import as_backend
from embedl_dynamo.graph.printer import format_graph
from embedl_dynamo.onnx.export import export_onnx
from embedl_dynamo.quant.weight_only.codes import WeightOnlySpec
from embedl_dynamo.quant.weight_only.embedding import WeightOnlyEmbedding, embedding_tables
from embedl_dynamo.quant.weight_only.linear import weight_only_graph
from embedl_dynamo.rewrite.engine import apply_transformation_plan, plan_transformation


class Lookup(nn.Module):
    """A constant table read by ``get_attr`` (as in a frozen Dynamo graph), looked up twice."""

    def __init__(self, dtype: torch.dtype = torch.float32, **lookup) -> None:
        super().__init__()
        table = torch.randn(50, 24, generator=torch.Generator().manual_seed(2)) * 3
        self.register_buffer("table", table.to(dtype))
        self.lookup = lookup

    def forward(self, ids: torch.Tensor, more: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.table, **self.lookup) + F.embedding(more, self.table)


class WrittenTable(Lookup):
    def forward(self, ids: torch.Tensor, more: torch.Tensor) -> torch.Tensor:
        self.table.mul_(2)
        return F.embedding(ids, self.table)


class TiedHead(Lookup):
    """The table also read by a matmul, as an output head tied to the embedding."""

    def forward(self, ids: torch.Tensor, more: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.table) @ self.table.t()


class TableInput(nn.Module):
    def forward(self, ids: torch.Tensor, more: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, torch.randn(64, 8) + more.float().sum())


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(seed))


def _graph(model: nn.Module) -> fx.GraphModule:
    """The canonical graph the pipeline hands the weight-only stage (tables read by
    ``get_attr``, as in a frozen Dynamo graph)."""
    target = as_backend("onnxruntime")
    patterns = [*target.conversion_patterns, *target.fusion_patterns]
    plan = plan_transformation(model.eval(), patterns, args=(_ids(), _ids(1)))
    return apply_transformation_plan(plan).model


def _int8(gm: fx.GraphModule) -> fx.GraphModule:
    return weight_only_graph(gm, [_ids(), _ids(1)], WeightOnlySpec(8))[0]


class LookupGraph(expecttest.TestCase):
    def test_each_lookup_reads_the_int8_table_shared_by_both(self):
        quantized = _int8(_graph(Lookup()))
        self.assertExpectedInline(
            format_graph(quantized),
            """\
input ids
input more
table_int8 = WeightOnlyEmbedding(ids)
table_int8_1 = WeightOnlyEmbedding(more)
add_1 = add(input=table_int8, other=table_int8_1)
return add_1""",
        )


def test_a_lookup_of_a_constant_float_table_gets_int8_codes_per_row():
    gm = _graph(Lookup())
    tables, rows = embedding_tables(gm)
    assert len(tables) == 2 and len(set(map(id, tables.values()))) == 1  # quantized once
    lookup = next(iter(tables.values()))
    assert lookup.codes.dtype == torch.int8 and lookup.codes.shape == (50, 24)
    assert lookup.scale.shape == (50, 1)
    assert [r["precision"] for r in rows] == ["int8_weight_only"] * 2
    assert "int8 codes per row" in rows[0]["reason"]
    quantized = _int8(gm)
    assert not hasattr(quantized, "table") and hasattr(gm, "table")  # gm is not modified
    int4 = weight_only_graph(gm, [_ids(), _ids(1)], WeightOnlySpec(4, group_size=32))[1]
    assert [(r["id"].split("@")[0], r["precision"]) for r in int4["layers"]] == [
        ("embedding", "int8_weight_only")
    ] * 2  # 8 bits under int4 too


@pytest.mark.filterwarnings("ignore:.*mutates table in place")
@pytest.mark.parametrize(
    "model, reason",
    [
        (Lookup(max_norm=1.0), "max_norm renormalises the table's rows in place"),
        (Lookup(torch.int64), "not a 2-d floating-point tensor"),
        (WrittenTable(), "the graph writes into the table"),
        (TableInput(), "not a constant of the graph"),
        (TiedHead(), "reads the table outside lookups"),
    ],
)
def test_a_lookup_keeps_its_float_table_with_the_reason(model, reason):
    gm = _graph(model)
    tables, rows = embedding_tables(gm)
    refused = [r for r in rows if r["precision"] == "fp32"]
    assert refused and all(reason in r["reason"] for r in refused), rows
    quantized, report = weight_only_graph(gm, [_ids(), _ids(1)], WeightOnlySpec(8))
    if isinstance(model, TableInput):
        assert not tables and not any(
            isinstance(m, WeightOnlyEmbedding) for m in quantized.modules()
        )
    kept = [r for r in report["layers"] if r["precision"] == "fp32"]
    assert kept and all(reason in r["reason"] for r in kept)  # the report says why, too


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rows_are_the_dequantized_table_within_half_a_step(dtype):
    gm = _graph(Lookup(dtype))
    quantized = _int8(gm)
    lookup = next(m for m in quantized.modules() if isinstance(m, WeightOnlyEmbedding))
    dense = lookup.dense_table()
    ids, more = _ids(), _ids(1)
    with torch.no_grad():
        got = quantized(ids, more)
        expected = dense[ids].to(dtype) + dense[more].to(dtype)  # each lookup rounds first
    assert got.dtype == dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    step = lookup.scale  # one per row: the dequantized table is within half a step of the float
    assert bool(((dense - gm.table.float()).abs() <= step * (0.5 + 1e-6)).all())


def test_a_zero_row_stays_zero():
    model = Lookup()
    model.table[3] = 0
    quantized = _int8(_graph(model))
    ids = torch.full((1, 4), 3)
    assert not quantized(ids, ids).any()


def test_the_onnx_file_gathers_from_the_int8_table(tmp_path):
    gm = _graph(Lookup())
    quantized = _int8(gm)
    path = export_onnx(quantized, [_ids(), _ids(1)], tmp_path / "lookup.onnx")
    model = onnx.load(str(path))
    tables = {i.name: i.data_type for i in model.graph.initializer if list(i.dims) == [50, 24]}
    assert list(tables.values()) == [TensorProto.INT8]  # no float copy of the table
    gathered = {n.input[0] for n in model.graph.node if n.op_type == "Gather"}
    assert set(tables) <= gathered
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), (_ids(), _ids(1)))}
    with torch.no_grad():
        expected = quantized(_ids(), _ids(1))
    torch.testing.assert_close(
        torch.from_numpy(session.run(None, feeds)[0]), expected, rtol=0, atol=0
    )


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime", "openvino"])
def test_the_tensorrt_target_keeps_float_tables_with_its_reason(backend):
    """TensorRT reads int8 constants through DequantizeLinear (its lint's rule), not as a
    Gather's table: that target keeps the float table; the others take int8."""
    from embedl_dynamo.backend import as_backend
    from embedl_dynamo.quant.weight_only.stage import weight_only_stage
    from embedl_dynamo.settings import Settings

    settings = Settings(precision="int8_weight_only")
    model, entries = weight_only_stage(
        _graph(Lookup()), [_ids(), _ids(1)], as_backend(backend), settings
    )
    lookups = [m for m in model.modules() if isinstance(m, WeightOnlyEmbedding)]
    precisions = {r["precision"] for r in entries["layers"]}
    if backend == "tensorrt":
        assert not lookups and precisions == {"fp32"}
        assert all("DequantizeLinear" in r["reason"] for r in entries["layers"])
    else:
        assert lookups and precisions == {"int8_weight_only"}
