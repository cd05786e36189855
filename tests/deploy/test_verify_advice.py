"""The way out a failed export verification advises: never the target already given."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedl_dynamo import export
from embedl_dynamo.errors import VerificationError


def test_a_bf16_openvino_export_onnx_runtime_cannot_run_is_not_advised_openvino_again(
    tmp_path, monkeypatch
) -> None:
    """Regression (issue 51 item 9): the advice named backend='openvino', the backend given."""
    from embedl_dynamo.tuning import half_form

    monkeypatch.setattr(half_form, "computes_in", lambda hint: False)  # the typed bf16 graph
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    kw = {"backend": "openvino", "precision": "bf16", "options": {"cache_dir": tmp_path / "c"}}
    with pytest.raises(VerificationError) as caught:
        export(model, torch.randn(2, 16), tmp_path / "m.onnx", **kw)
    message = str(caught.value)
    assert "kernel for tensor(bfloat16)" in message and "verify=False" in message
    assert "backend='openvino'" not in message and "OpenVINO, which runs this target's" in message
