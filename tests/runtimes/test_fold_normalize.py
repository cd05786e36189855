"""``F.unfold``/``F.fold`` (MobileViTV2's patch embedding) and ``F.normalize`` on both CPU
runtimes: the rows of :mod:`embedl_dynamo.runtimes.conformance.fold_rows` and the
``normalize`` rows, checked here where OpInfo has no sample (``fold`` has no OpInfo entry;
``nn.functional.unfold``'s and ``nn.functional.normalize``'s run in the slow sweep).

``unfold`` is moves alone (exact); ``fold`` is ONNX's Col2Im (bounded); with a padding that
differs between height and width ``fold`` is exported wrongly and stays in PyTorch, as both
stay without a batch axis where a runtime refuses that. For ``normalize`` of a 0-d tensor
PyTorch's exporter reduces over axis 0 of a rank-0 tensor (ONNX Runtime refuses it, OpenVINO
ended the process on it), so it is an op of its own, exported in a rank-1 form
(:mod:`embedl_dynamo.graph.exact_ops`); of any rank, non-finite inputs go to PyTorch by the
per-call guard where a runtime computes them otherwise."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import embedl_dynamo
from embedl_dynamo.dynamo import call_guards
from embedl_dynamo.runtimes.conformance import Verdict, node_blocker, op_name
from tests.helpers import dynamo_graph, runtime_compiled
from tests.runtimes.conformance_check import assert_conforms, compile_on, placement

RUNTIMES = ("onnxruntime", "openvino")
EDGES = (float("nan"), float("inf"), -float("inf"), -0.0)


class _PatchMixer(nn.Module):
    """MobileViTV2's unfolding: 2x2 patches of a feature map, mixed, folded back."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.mix = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        patches = F.unfold(y, kernel_size=2, stride=2)  # (n, 8 * 4, 16)
        n, _, count = patches.shape
        mixed = self.mix(patches.reshape(n, 8, 4 * count).transpose(1, 2))
        return F.fold(mixed.transpose(1, 2).reshape(n, 32, count), (8, 8), 2, stride=2)


class _CosineAttention(nn.Module):
    """Swin V2's scaled cosine attention: ``normalize`` on rank-3 queries and keys."""

    def __init__(self) -> None:
        super().__init__()
        self.qk = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).chunk(2, dim=-1)
        return F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)


def _within_bound_on(model: nn.Module, runtime: str, shape: tuple[int, ...]) -> None:
    """``model`` compiled for ``runtime`` runs there whole and matches eager within the
    bound over several calls."""
    compiled = runtime_compiled(model.eval(), runtime)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(shape, generator=generator)
            assert_conforms(model(x), compiled(x), Verdict.BOUNDED, runtime)
            subgraphs = embedl_dynamo.last_report().subgraphs
            assert subgraphs and all(s.runtime == runtime and not s.kept for s in subgraphs)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_unfold_and_fold_run_on_the_runtime(runtime):
    _within_bound_on(_PatchMixer(), runtime, (2, 3, 8, 8))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_normalize_runs_on_the_runtime(runtime):
    """Within the bound; a call with a NaN or an infinity (listed differences on both
    runtimes) gives eager's values, the guard sending it to PyTorch."""
    model = _CosineAttention().eval()
    _within_bound_on(model, runtime, (2, 5, 16))
    compiled = runtime_compiled(model, runtime)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_conforms(model(x), compiled(x), Verdict.BOUNDED, runtime)
        edged = _with_edges(x)
        assert_conforms(model(edged), compiled(edged), Verdict.BOUNDED, f"{runtime}, edges")


def _with_edges(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    for i, value in enumerate(EDGES):
        x.view(-1)[i::7] = value
    return x


def _folds(cols: torch.Tensor, image: torch.Tensor, unbatched: torch.Tensor):
    """``fold`` over overlapping windows, with tuple dilation and stride, and unbatched;
    ``unfold`` with asymmetric padding; and the forms kept in PyTorch."""
    return (
        F.fold(cols, (7, 8), 3, padding=1),  # 56 windows of 3x3, overlapping
        F.fold(cols[:, :18, :12], (7, 8), (2, 3), dilation=(1, 2), stride=(2, 1)),
        F.fold(unbatched, (4, 6), 2, stride=2),
        F.unfold(image, (2, 3), dilation=(1, 2), padding=(1, 0), stride=(2, 1)),
        F.fold(cols[:, :, :42], (7, 8), 3, padding=(1, 0)),  # another padding per axis
        F.unfold(image[0], 2, stride=2),  # no batch axis
    )


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_fold_and_unfold_match_pytorch_with_edge_values(runtime):
    """Each call on values holding NaN, +-inf and -0.0: ``unfold`` bit for bit, ``fold``
    within the bound; the unequal padding, the unbatched unfold and, on ONNX Runtime, the
    unbatched fold stay in PyTorch with their reasons."""
    generator = torch.Generator().manual_seed(1)
    args = [torch.randn(s, generator=generator) for s in ((2, 18, 56), (2, 3, 7, 8), (12, 6))]
    torch._dynamo.reset()
    compiled = compile_on(_folds, runtime, fallback="eager")
    for call in (args, [_with_edges(a) for a in args]):
        got, want = compiled(*call), _folds(*call)
        assert_conforms(want, got, Verdict.BOUNDED, runtime)
        assert_conforms(want[3], got[3], Verdict.EXACT, f"unfold on {runtime}")
        ran, reasons = placement(embedl_dynamo.last_report().subgraphs, runtime)
        kept = sorted(r.split(" on ", 1)[0] for r in reasons)
        unbatched = ["fold(unbatched)"] if runtime == "onnxruntime" else []
        assert ran and kept == sorted(["fold(unequal padding)", "unfold(unbatched)", *unbatched])
        assert any("(h, h, w, w)" in r for r in reasons)


def test_a_0_d_normalize_is_an_op_of_its_own():
    """Judged by its own row: the export of a 0-d one is the rank-1 form of
    :mod:`embedl_dynamo.graph.exact_ops` (the exporter's own form reduces over axis 0 of a
    rank-0 tensor: ONNX Runtime refuses it, OpenVINO ended the process on it)."""
    gm = dynamo_graph(
        lambda s, x: (F.normalize(s, p=1.2, dim=0), F.normalize(x, dim=0)),
        *(torch.tensor(0.5), torch.randn(5)),
    )
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [op_name(n) for n in nodes] == ["normalize(0-d)", "normalize"]
    for runtime in RUNTIMES:
        assert [node_blocker(n, runtime) for n in nodes] == [None, None]


def test_tensor_unfold_is_another_op_than_f_unfold():
    """``Tensor.unfold`` (a sliding window over one dimension) has no row: it stays in
    PyTorch, whatever ``F.unfold``'s row says."""
    gm = dynamo_graph(
        lambda x: (x.unfold(1, 2, 1) + 1, F.unfold(x, 2) + 1), torch.randn(1, 3, 4, 4)
    )
    calls = [n for n in gm.graph.nodes if op_name(n) in ("Tensor.unfold", "unfold")]
    assert [op_name(n) for n in calls] == ["Tensor.unfold", "unfold"]
    assert "no conformance row" in node_blocker(calls[0], "openvino")
    assert node_blocker(calls[1], "openvino") is None


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_0_d_normalize_runs_on_the_runtime_and_matches_pytorch(runtime):
    """``normalize(0-d)``'s row: it runs on the runtime, within the bound; an infinity (the
    listed difference: the runtime's norm of it is float32's largest value) shows without the
    per-call guard and goes to PyTorch with it."""

    def fn(s: torch.Tensor) -> torch.Tensor:
        return F.normalize(s, p=1.2, dim=0) * 3

    torch._dynamo.reset()
    compiled = compile_on(fn, runtime)
    for value in (0.7, -2.5, 0.0, -0.0, 1e-30, float("inf"), float("nan")):
        s = torch.tensor(value)
        assert_conforms(fn(s), compiled(s), Verdict.BOUNDED, f"normalize of {value}")
    ran, reasons = placement(embedl_dynamo.last_report().subgraphs, runtime)
    assert ran and not reasons
    torch._dynamo.reset()
    with mock.patch.object(call_guards, "needs_finite_inputs", lambda node, runtime: False):
        unguarded = compile_on(fn, runtime)
        assert unguarded(torch.tensor(0.7)) == fn(torch.tensor(0.7))  # the first call, checked
        infinite = torch.tensor(float("inf"))
        assert fn(infinite).isnan() and unguarded(infinite) == float("inf")
