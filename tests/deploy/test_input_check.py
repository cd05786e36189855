"""A loaded file names a wrong input dtype or a static batch with the fix (issue 39 item 10),
instead of ONNX Runtime's raw error or a ``dynamic_shapes`` hint for the batch axis."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embedl_dynamo import export, load
from embedl_dynamo.deploy.input_check import check_inputs


class _Ids(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(ids)).mean(1)


@pytest.fixture(scope="module")
def static_ids_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("ids")
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (2, 5))
    path = export(
        _Ids().eval(),
        ids,
        root / "ids.onnx",
        backend="onnxruntime",
        dynamic_batch=False,
        options={"cache_dir": root / "c"},
    )
    return load(path), ids


def test_int32_ids_into_an_int64_file_name_the_dtype(static_ids_file):
    module, ids = static_ids_file
    with pytest.raises(TypeError, match=r"input 0 \(input_0\) is int32, the file takes int64"):
        module(ids.int())
    assert module(ids).shape == (2, 4)


def test_a_static_batch_suggests_dynamic_batch(static_ids_file):
    module, ids = static_ids_file
    with pytest.raises(ValueError, match="axis 0 is static .*dynamic_batch=True") as caught:
        module(torch.cat([ids, ids]))
    assert "dynamic_shapes" not in str(caught.value)


def test_another_static_axis_suggests_dynamic_shapes():
    spec = {"inputs": [{"name": "input_0", "shape": ["batch", 5], "dtype": "int64"}]}
    with pytest.raises(ValueError, match=r"axis 1 is static \(5\).*dynamic_shapes=\[\{1: 'seq'\}"):
        check_inputs("f.onnx", spec, [torch.zeros(2, 7, dtype=torch.int64)])
    check_inputs("f.onnx", spec, [torch.zeros(3, 5, dtype=torch.int64)])  # batch is dynamic
    check_inputs("f.onnx", {}, [torch.zeros(3)])  # no sidecar: nothing to check
