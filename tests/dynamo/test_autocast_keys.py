"""A compile under ``torch.autocast`` never replaces the artifact of the same model compiled in
fp32 (issue 50 item 8): it used to store its bf16 (ONNX Runtime) or f16 (OpenVINO) artifact
under the fp32 graph's key, and every later fp32 compile loaded it, failed and ran in PyTorch."""

from __future__ import annotations

import contextlib

import pytest
import torch

import embedl_dynamo
from tests.helpers import assert_close_to_scale
from tests.models import TinyConvNet

X = torch.randn(2, 3, 8, 8)


def _compile_and_call(model, backend, context):
    """A fresh compile's first call under ``context``: its output and its subgraph's report."""
    torch._dynamo.reset()
    embedl_dynamo.clear_reports()
    compiled = torch.compile(model, backend=f"embedl_{backend}")
    with torch.inference_mode(), context:
        out = compiled(X)
    embedl_dynamo.wait_for_cache_writes(timeout=60)
    (report,) = embedl_dynamo.last_report().subgraphs
    return out, report


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_an_autocast_compile_leaves_the_fp32_artifact_to_later_fp32_compiles(backend):
    model = TinyConvNet().eval()
    _, first = _compile_and_call(model, backend, contextlib.nullcontext())
    assert first.runtime == backend and not first.cached
    fp32_key = first.runtime_info["key"]

    _, under_autocast = _compile_and_call(model, backend, torch.autocast("cpu", torch.bfloat16))
    assert under_autocast.runtime_info.get("key") != fp32_key

    out, again = _compile_and_call(model, backend, contextlib.nullcontext())
    assert (again.runtime, again.cached, again.runtime_info["key"]) == (backend, True, fp32_key)
    assert again.loaded  # the warm start's alias, not a rebuild
    assert out.dtype == torch.float32
    with torch.no_grad():
        assert_close_to_scale(out, model(X))
