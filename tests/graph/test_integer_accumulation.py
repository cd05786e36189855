"""Integer ``cumsum``/``cumprod`` keep PyTorch's int64 promotion on a runtime and in a file
(issue 39 item 2): ``mask.cumsum(-1)`` on an int32 mask is int64 in eager."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import fx, nn

import embedl_dynamo
import embedl_dynamo.graph.canonicalize as canonicalize_module
import embedl_dynamo.onnx.export as onnx_export
from embedl_dynamo.graph.integer_accumulation import accumulate_integers_in_int64
from embedl_dynamo.onnx.export import export_onnx


class _Positions(nn.Module):
    """HF-style position ids from an int32 attention mask, and a count."""

    def forward(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = (mask * 3).cumsum(-1) - 1
        return positions * mask, (mask + 1).sum(-1)


def test_an_int32_cumsum_compiles_to_int64_values_beyond_int32():
    model = _Positions().eval()
    mask = torch.full((2, 6), 2**29, dtype=torch.int32)  # the running sum passes 2**31
    compiled = torch.compile(model, backend="embedl_onnxruntime")
    expected, actual = model(mask), compiled(mask)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert (sub.status, sub.runtime) == ("compiled", "onnxruntime"), sub.reason
    for e, a in zip(expected, actual, strict=True):
        assert a.dtype == e.dtype == torch.int64
        assert torch.equal(a, e)


def test_an_op_whose_dtype_the_runtime_changes_runs_in_pytorch_with_the_reason(monkeypatch):
    """Without the int64 cast (an op whose promotion the export loses), the first-call check
    sees int32 where PyTorch gives int64: narrowed to the ``cumsum`` that gives it, that op
    runs in PyTorch, with the reason, and the outputs keep PyTorch's dtypes."""
    monkeypatch.setattr(canonicalize_module, "accumulate_integers_in_int64", lambda gm: False)
    monkeypatch.setattr(onnx_export, "cast_outputs", lambda model, dtypes: 0)
    model = _Positions().eval()
    mask = torch.randint(0, 2, (2, 6), dtype=torch.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        actual = torch.compile(model, backend="embedl_onnxruntime")(mask)
    (sub,) = embedl_dynamo.last_report().subgraphs
    assert sub.status == "partitioned", sub.reason
    failed = [k for k in sub.kept if "failed on it" in k["reason"]]
    assert [k["op"] for k in failed] == ["cumsum"], sub.kept
    assert "output 0 has dtype int32, PyTorch gives int64" in failed[0]["reason"]
    assert [a.dtype for a in actual] == [torch.int64, torch.int64]
    assert all(torch.equal(a, e) for a, e in zip(actual, model(mask), strict=True))
    assert sum("dtype int32" in str(w.message) for w in caught) == 1


def test_the_pass_casts_only_what_pytorch_promotes():
    def f(a, b, c):
        return a.cumsum(0), torch.cumprod(b, 0), c.cumsum(0), a.cumsum(0, dtype=torch.int32)

    args = (torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.bool), torch.ones(3))
    gm = fx.symbolic_trace(f)
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), args):
        node.meta["val"] = value
    assert accumulate_integers_in_int64(gm)
    casts = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "to"]
    assert [c.args[0].name for c in casts] == ["a", "b"]  # not the float, not dtype=
    assert [o.dtype for o in gm(*args)] == [o.dtype for o in f(*args)]
    assert not accumulate_integers_in_int64(gm)  # idempotent


def test_an_exported_output_is_cast_to_pytorchs_dtype(tmp_path):
    """The net under the source fix: a graph without shape metadata (the pass cannot see its
    dtypes) still exports a file whose outputs have eager's dtypes."""
    ort = pytest.importorskip("onnxruntime")
    gm = fx.symbolic_trace(_Positions())
    mask = torch.randint(0, 2, (2, 6), dtype=torch.int32)
    for exporter in ("torchscript", "dynamo"):
        path = export_onnx(gm, [mask], tmp_path / f"{exporter}.onnx", exporter=exporter)
        got = ort.InferenceSession(str(path)).run(None, {"input_0": mask.numpy()})
        expected = gm(mask)
        assert [str(g.dtype) for g in got] == ["int64", "int64"], exporter
        assert all(torch.equal(torch.from_numpy(g), e) for g, e in zip(got, expected))
