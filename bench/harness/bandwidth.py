"""The read bandwidth a large reduction reaches here: the denominator of a decode roofline.

A decode step of a decoder at batch 1 reads every weight once, so its fastest possible time is
its weight bytes over the bandwidth memory gives one process's threads. That bandwidth is
measured, not assumed: the fastest of five ``sum`` calls over 1 GiB of float32, timed by the
one timer.
"""

from __future__ import annotations

__all__ = ["read_bandwidth_gbs"]


def read_bandwidth_gbs(gib: float = 1.0) -> float:
    """GB per second that ``torch.sum`` reads over ``gib`` GiB of float32 (its fastest of 5)."""
    import torch

    from bench.harness.timer import interleaved

    data = torch.ones(int(gib * 2**30) // 4)
    timings = interleaved({"sum": data.sum}, 1, warmup=1, repeat=5, pause_s=0.0)
    return data.numel() * 4 / timings.minimum("sum") / 1e9
