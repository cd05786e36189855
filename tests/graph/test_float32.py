"""References in IEEE float32 (:mod:`embedl_dynamo.graph.float32`): TF32 is off inside, the
caller's flags come back after, also when the block raises."""

from __future__ import annotations

import pytest
import torch

from embedl_dynamo.graph.float32 import exact_float32


@pytest.fixture
def tf32_on(monkeypatch):
    """A process that initialised CUDA and allows TF32 (the flags exist without a GPU)."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (cudnn.allow_tf32, matmul.allow_tf32)
    cudnn.allow_tf32 = matmul.allow_tf32 = True
    yield cudnn, matmul
    cudnn.allow_tf32, matmul.allow_tf32 = saved


def test_tf32_is_off_inside_and_restored_after(tf32_on):
    cudnn, matmul = tf32_on
    with exact_float32():
        assert (cudnn.allow_tf32, matmul.allow_tf32) == (False, False)
    assert (cudnn.allow_tf32, matmul.allow_tf32) == (True, True)
    with pytest.raises(ValueError), exact_float32():
        raise ValueError("a reference that fails")
    assert (cudnn.allow_tf32, matmul.allow_tf32) == (True, True)


def test_the_judges_references_are_computed_in_ieee_float32(tf32_on, monkeypatch):
    from embedl_dynamo.runtimes.reference import graph_outputs
    from embedl_dynamo.tuning.judge import sample_outputs

    cudnn, _ = tf32_on
    seen = []

    def model(x: torch.Tensor) -> torch.Tensor:
        seen.append(cudnn.allow_tf32)
        return x + 1

    graph_outputs(model, [torch.ones(2)])
    sample_outputs(model, [[torch.ones(2)]])
    assert seen == [False, False] and cudnn.allow_tf32


def test_without_cuda_it_changes_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    cudnn = torch.backends.cudnn
    before = cudnn.allow_tf32
    with exact_float32():
        assert cudnn.allow_tf32 == before
