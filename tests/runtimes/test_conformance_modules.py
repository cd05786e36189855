"""Layer-level conformance (issue 50): the layers PyTorch's ``module_db`` (ModuleInfo) samples,
compiled whole onto each CPU runtime, run there and match eager within the ``bounded``
verdict's bound. The op-level sweep (``test_conformance.py``) checks each op's edge values;
this checks that the form Dynamo records for each layer (``hardtanh`` for ``nn.ReLU6``,
``interpolate`` for ``nn.Upsample``) has its rows.

CI compiles a batched sample of every layer below as one graph per runtime, all of it on the
runtime; ``-m slow`` compiles each layer's samples (up to :data:`SLOW_SAMPLES`) one graph per
layer, where the table may keep an op of an odd sample in PyTorch (its reason says so) but no
part may fail to build. ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` are traced with Dynamo's
``allow_rnn`` set (their samples are unbatched; an LSTM with ``proj_size`` is kept by its row).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from embedl_dynamo import last_report
from embedl_dynamo.runtimes.conformance import Verdict
from embedl_dynamo.runtimes.openvino.runtime import OpenVINORuntime
from tests.runtimes.conformance_check import assert_conforms, compile_on, placement

#: the layers whose missing rows kept whole models in PyTorch, and their neighbours
#: (not ``nn.CircularPad2d``: its row keeps it, the ONNX export ends the process on some
#: circular padding; ``nn.RMSNorm`` is exported in PyTorch's formula, graph/exact_ops.py)
LAYERS = (
    "nn.AvgPool1d",
    "nn.AvgPool2d",
    "nn.Conv1d",
    "nn.Conv2d",
    "nn.ConvTranspose1d",
    "nn.ConvTranspose2d",
    "nn.ELU",
    "nn.GELU",
    "nn.GroupNorm",
    "nn.Hardswish",
    "nn.Hardtanh",
    "nn.InstanceNorm1d",
    "nn.InstanceNorm2d",
    "nn.LayerNorm",
    "nn.LeakyReLU",
    "nn.Linear",
    "nn.Mish",
    "nn.PReLU",
    "nn.ReLU6",
    "nn.SiLU",
    "nn.Sigmoid",
    "nn.Softplus",
    "nn.Tanh",
    "nn.ReflectionPad1d",
    "nn.ReflectionPad2d",
    "nn.ReplicationPad1d",
    "nn.ReplicationPad2d",
    "nn.ZeroPad2d",
    "nn.ConstantPad1d",
    "nn.ConstantPad2d",
    "nn.RMSNorm",
    "nn.LSTM",
    "nn.GRU",
    "nn.RNN",
)
RUNTIMES = ("onnxruntime", "openvino")
SLOW_SAMPLES = 8


def _no_op() -> None:
    return None


@functools.cache
def _module_db() -> dict[str, Any]:
    # as test_conformance._op_db: the import must leave torch.backends' flags as they are
    frozen, torch.backends.disable_global_flags = torch.backends.disable_global_flags, _no_op
    try:
        from torch.testing._internal.common_modules import module_db
    finally:
        torch.backends.disable_global_flags = frozen
    return {info.name: info for info in module_db}


def _samples(name: str, limit: int) -> list[tuple[torch.nn.Module, tuple, dict]]:
    """Up to ``limit`` of the layer's float32 samples: ``(module in eval mode, args, kwargs)``
    (a sample whose forward takes no tensor is left out)."""
    info = _module_db()[name]
    inputs = info.module_inputs_func(
        info, device="cpu", dtype=torch.float32, requires_grad=False, training=False
    )
    out = []
    for sample in inputs:
        args, kwargs = sample.forward_input.args, sample.forward_input.kwargs
        if not any(isinstance(a, torch.Tensor) for a in args):
            continue
        torch.manual_seed(0)
        ctor = sample.constructor_input
        module = info.module_cls(*ctor.args, **ctor.kwargs).eval()
        out.append((module, args, kwargs))
        if len(out) == limit:
            break
    return out


class _Layers(torch.nn.Module):
    """Several layers, each on its own inputs, as one module (one graph, one compile)."""

    def __init__(self, samples: list[tuple[torch.nn.Module, tuple, dict]]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(m for m, _, _ in samples)
        self.kwargs = [kwargs for _, _, kwargs in samples]
        self.counts = [len(args) for _, args, _ in samples]

    def forward(self, *tensors: torch.Tensor) -> tuple[Any, ...]:
        outs, start = [], 0
        for layer, count, kwargs in zip(self.layers, self.counts, self.kwargs):
            outs.append(layer(*tensors[start : start + count], **kwargs))
            start += count
        return tuple(outs)


@contextmanager
def _recurrent_traced() -> Iterator[None]:
    """Dynamo records ``nn.LSTM``/``nn.GRU``/``nn.RNN`` only with ``allow_rnn`` set (by
    default it leaves them out of its graph); the old value is restored."""
    old = torch._dynamo.config.allow_rnn
    torch._dynamo.config.allow_rnn = True
    try:
        yield
    finally:
        torch._dynamo.config.allow_rnn = old


#: the words of a reason the table gives (a kept row, no row): anything else is a build failure
TABLE_REASONS = ("stays in PyTorch on", "has no conformance row for")


def _check(
    samples: list[tuple[torch.nn.Module, tuple, dict]],
    runtime: str,
    what: str,
    table_may_keep: bool = False,
) -> None:
    """The samples as one graph on ``runtime``: equal to eager within the bound, and all on the
    runtime; with ``table_may_keep``, an op the table keeps (a size of 0, an unbatched pool,
    another softplus threshold) may stay in PyTorch, but no part of the graph may fail to
    build."""
    module = _Layers(samples).eval()
    inputs = tuple(a for _, args, _ in samples for a in args)
    torch._dynamo.reset()
    with torch.inference_mode(), warnings.catch_warnings(), _recurrent_traced():
        warnings.simplefilter("ignore")
        expected = module(*inputs)
        actual = compile_on(module, runtime, fallback="eager")(*inputs)
    assert_conforms(expected, actual, Verdict.BOUNDED, f"{what} on {runtime}")
    ran, kept = placement(last_report().subgraphs, runtime)
    if table_may_keep:
        kept = [k for k in kept if not any(words in k for words in TABLE_REASONS)]
    assert ran and not kept, f"{what}: not all on {runtime}: {kept}"


def _marks(runtime: str) -> tuple[Any, ...]:
    if runtime == "openvino" and not OpenVINORuntime.is_available():
        return (pytest.mark.skip(reason="no openvino"),)
    return ()


def _batched(name: str) -> tuple[torch.nn.Module, tuple, dict]:
    """The first of the layer's samples with the most axes (a batch axis: an unbatched
    ``AvgPool1d`` input is refused loudly by ONNX Runtime, and would keep the whole graph)."""
    samples = _samples(name, SLOW_SAMPLES)
    return max(samples, key=lambda s: s[1][0].dim())


@pytest.mark.parametrize("runtime", [pytest.param(r, marks=_marks(r)) for r in RUNTIMES])
def test_layers_run_on_the_runtime(runtime):
    """A batched sample of every layer of :data:`LAYERS`, as one graph."""
    _check([_batched(name) for name in LAYERS], runtime, "the layers")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "runtime"),
    [pytest.param(n, r, id=f"{n}-{r}", marks=_marks(r)) for n in LAYERS for r in RUNTIMES],
)
def test_layer_samples_run_on_the_runtime(name, runtime):
    _check(_samples(name, SLOW_SAMPLES), runtime, name, table_may_keep=True)
