"""A write-back that cannot be made writes no input twice (issue 50 item 9): the inputs a graph
writes in place are copied back all or nothing, so a call that then runs in PyTorch finds them
as given, and every input ends as PyTorch leaves it."""

from __future__ import annotations

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.dynamo import write_back


def _write_two(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)
    b.mul_(2)
    return a + b


def _expanded() -> torch.Tensor:
    return torch.ones(1).expand(4)  # PyTorch refuses to write it, before writing anything


def _inference() -> torch.Tensor:
    with torch.inference_mode():
        return torch.ones(4)  # written outside inference mode: PyTorch writes it, then raises


def _compiled():
    compiled = torch.compile(_write_two, backend="embedl_onnxruntime")
    a, b = torch.ones(4), torch.ones(4)
    with torch.no_grad():
        assert torch.equal(compiled(a, b), torch.full((4,), 4.0))
    assert torch.equal(a, torch.full((4,), 2.0)) and torch.equal(b, a)  # written once
    assert [s.runtime for s in embedl_dynamo.last_report().subgraphs] == ["onnxruntime"]
    return compiled


def _outcome(function, b: torch.Tensor) -> tuple[str, torch.Tensor, torch.Tensor]:
    """What ``function`` raises and how it leaves its inputs (``b`` and a tensor of ones)."""
    a = torch.ones(4)
    with torch.no_grad():
        try:
            function(a, b)
        except RuntimeError as exc:
            return str(exc).split(".")[0], a, b.clone()
    return "", a, b.clone()


@pytest.mark.parametrize("make_b", [_expanded, _inference])
def test_a_write_back_that_cannot_be_made_leaves_the_inputs_as_pytorch_does(make_b):
    compiled = _compiled()
    got, want = _outcome(compiled, make_b()), _outcome(_write_two, make_b())
    assert want[0], "PyTorch raises on this call"
    assert got[0] == want[0]
    assert torch.equal(got[1], want[1]), "the first input is written once, as in PyTorch"
    assert torch.equal(got[2], want[2])
    reasons = [s.reason for s in embedl_dynamo.last_report().subgraphs]
    assert any("written input 1 cannot take its new value" in r for r in reasons), reasons


def test_a_copy_failing_after_its_check_is_not_followed_by_a_rerun(monkeypatch):
    compiled = _compiled()
    monkeypatch.setattr(write_back, "copy_problem", lambda target, value: None)
    error, a, b = _outcome(compiled, _expanded())
    assert "more than one element of the written-to tensor" in error
    assert torch.equal(a, torch.full((4,), 2.0)), "written back once, the graph not run again"
    assert torch.equal(b, torch.ones(4))


def test_copy_problem_names_each_copy_pytorch_refuses():
    target = torch.zeros(2, 3)
    assert write_back.copy_problem(target, torch.ones(2, 3)) is None
    assert write_back.copy_problem(target, torch.ones(3)) is None  # broadcasts, as copy_ does
    assert "shape (4,)" in write_back.copy_problem(target, torch.ones(4))
    assert "not a tensor" in write_back.copy_problem(target, 1.0)
    assert "expanded" in write_back.copy_problem(torch.zeros(1).expand(3), torch.ones(3))
    assert "inference tensor" in write_back.copy_problem(_inference(), torch.ones(4))
    with torch.inference_mode():
        assert write_back.copy_problem(_inference(), torch.ones(4)) is None
