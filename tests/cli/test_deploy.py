"""``embedl-dynamo deploy``: builds a cache once; ``--check`` starts a replica from it read-only."""

from __future__ import annotations

import pytest

from embedl_dynamo.cli.main import main

NET = """
import torch
from torch import nn

def build():
    torch.manual_seed(0 if {seeded} else torch.seed())
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
"""


@pytest.mark.parametrize("seeded", [True, False], ids=["same weights", "new weights each time"])
def test_deploy_builds_a_cache_a_replica_starts_from(tmp_path, capfd, seeded):
    net = tmp_path / "net.py"
    net.write_text(NET.format(seeded=seeded))
    cache = tmp_path / "cache"
    argv = ["deploy", f"{net}:build", "--input-shape", "1,3,8,8", "--backend", "onnxruntime",
            "--cache-dir", str(cache), "--batch-sizes", "1,3", "--check"]  # fmt: skip
    code = main(argv)
    out = capfd.readouterr()
    assert "cache ready in" in out.out and "built" in out.out
    if seeded:
        assert code == 0, out.err
        assert "replica check: 2 subgraph(s) loaded, nothing built or written" in out.out
    else:  # the replica's weights differ from the build's: it must not pass as loaded
        assert code == 4
        assert "the cache lacks them" in out.err and "seeded" in out.err


def test_deploy_refuses_bad_batch_sizes(tmp_path, capfd):
    net = tmp_path / "net.py"
    net.write_text(NET.format(seeded=True))
    code = main(["deploy", f"{net}:build", "--input-shape", "1,3,8,8", "--batch-sizes", "1,x"])
    assert code == 2 and "invalid --batch-sizes" in capfd.readouterr().err
