"""What a compiled graph assumes of its inputs is checked on every call, not only the first
(issue 39 items 2 and 4): inputs a graph writes in place must not overlap another input, and a
call with other dtypes gets eager's values and dtypes."""

from __future__ import annotations

import warnings

import pytest
import torch

import embedl_dynamo
from embedl_dynamo.dynamo.input_overlap import overlapping_input


def _write_then_read(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)
    return b * 2 + 1


def _calls(compiled, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(*args)
    return out, [str(w.message) for w in caught if "shares memory" in str(w.message)]


def test_overlapping_views_after_the_first_call_get_eagers_answer():
    compiled = torch.compile(_write_then_read, backend="embedl_onnxruntime")
    a, b = torch.ones(4), torch.ones(4)
    assert torch.equal(compiled(a, b), torch.full((4,), 3.0))
    assert [s.runtime for s in embedl_dynamo.last_report().subgraphs] == ["onnxruntime"]
    big, big_eager = torch.ones(5), torch.ones(5)
    out, warned = _calls(compiled, big[:4], big[1:])
    assert torch.equal(out, _write_then_read(big_eager[:4], big_eager[1:]))  # [5, 5, 5, 3]
    assert torch.equal(big, big_eager)
    assert len(warned) == 1 and "PyTorch" in warned[0]
    out, warned = _calls(compiled, big[:4], big[1:])
    assert torch.equal(out, _write_then_read(big_eager[:4], big_eager[1:]))
    assert not warned, "one warning per subgraph"


def test_disjoint_views_of_one_tensor_still_run_compiled():
    compiled = torch.compile(_write_then_read, backend="embedl_onnxruntime")
    compiled(torch.ones(4), torch.ones(4))
    big, big_eager = torch.ones(8), torch.ones(8)
    out, warned = _calls(compiled, big[:4], big[4:])
    assert torch.equal(out, _write_then_read(big_eager[:4], big_eager[4:]))
    assert torch.equal(big, big_eager)
    assert not warned


def test_overlap_is_found_only_where_a_written_input_shares_memory():
    big = torch.zeros(10)
    assert overlapping_input([big[:4], big[2:6], torch.zeros(3)], [0]) == 0
    assert overlapping_input([big[:4], big[2:6], torch.zeros(3)], [2]) is None
    assert overlapping_input([big[:4], big[4:8]], [0, 1]) is None
    assert overlapping_input([torch.zeros(3), big[5:], big[:6]], [1]) == 1
    grid = torch.zeros(4, 4)
    assert overlapping_input([grid[:, 0], grid[3]], [1]) == 1  # a column's span covers row 3
    assert overlapping_input([grid[:, 0], grid[3]], []) is None


def _cumsum_scaled(mask: torch.Tensor) -> torch.Tensor:
    return mask.cumsum(-1) * 3 + mask.sum(-1, keepdim=True)


@pytest.mark.parametrize("guard_filter", [None, "skip_guard_on_all_nn_modules_unsafe"])
def test_another_integer_dtype_gets_eagers_values_and_dtype(guard_filter):
    options = {}
    if guard_filter is not None:
        options["guard_filter_fn"] = getattr(torch.compiler, guard_filter)
    compiled = torch.compile(_cumsum_scaled, backend="embedl_onnxruntime", options=options)
    for dtype in (torch.int64, torch.int32, torch.int64, torch.int32):
        mask = torch.ones(2, 3000, dtype=dtype)
        got, want = compiled(mask), _cumsum_scaled(mask)
        assert got.dtype == want.dtype == torch.int64
        assert torch.equal(got, want)
    runtimes = {s.runtime for s in embedl_dynamo.last_report().subgraphs}
    assert runtimes == {"onnxruntime"}, runtimes


def test_float64_after_float32_gets_eagers_dtype():
    def scaled(x):
        return torch.softmax(x * 3, -1).cumsum(-1)

    compiled = torch.compile(scaled, backend="embedl_onnxruntime")
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(3, 16, dtype=dtype)
        got, want = compiled(x), scaled(x)
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
