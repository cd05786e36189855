"""Helpers shared by the tests, one copy each: output comparisons, Dynamo capture (raw or with the
library's own freeze), seeded batches, fake-quant queries on a graph, a plan printout that does not
pin FX node names, build counts taken by wrapping the library's builders, and tiny random-init
decoder LLMs of transformers' own classes with greedy generation."""

from __future__ import annotations

import collections
import functools
import importlib
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from embedl_dynamo.cache.files import wait_for_cache_writes
from embedl_dynamo.graph.freeze import freeze
from embedl_dynamo.quant.int8.insert import FakeQuantize
from embedl_dynamo.rewrite.plan import TransformationPlan

__all__ = [
    "BUILD_COUNTS",
    "assert_close_to_scale",
    "assert_same_outputs",
    "called_module",
    "count_builds",
    "dynamo_frozen",
    "dynamo_graph",
    "greedy_generate",
    "is_fake_quant",
    "left_padded_batch",
    "max_abs_diff",
    "plan_table",
    "random_batches",
    "tiny_decoder",
]


def max_abs_diff(expected: Any, actual: Any) -> float:
    """max |expected - actual| over a tensor or (nested) tuples/lists of tensors."""
    if isinstance(expected, (tuple, list)):
        return max(max_abs_diff(e, a) for e, a in zip(expected, actual, strict=True))
    if isinstance(actual, (tuple, list)):
        (actual,) = actual
    return (expected - actual).detach().abs().max().item()


def assert_same_outputs(
    model: nn.Module, transformed: nn.Module, *args: torch.Tensor, atol: float = 1e-5
) -> None:
    """A float rewrite keeps the outputs: max abs difference <= ``atol`` (1e-5)."""
    with torch.no_grad():
        diff = max_abs_diff(model(*args), transformed(*args))
    assert diff <= atol, f"max abs diff {diff:.3g} > {atol:g}"


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-4) -> None:
    """max |a - e| <= rtol * max|e| (1e-4 relative to the output scale)."""
    actual, expected = actual.detach(), expected.detach()
    scale = float(expected.abs().max())
    err = float((actual - expected).abs().max())
    assert err <= rtol * max(scale, 1e-6), f"max abs diff {err:.3g} vs scale {scale:.3g}"


def _dynamo_capture(
    model: nn.Module, args: tuple[torch.Tensor, ...], dynamic: bool, keep: Callable[..., Any]
) -> Any:
    """``keep(gm, inputs)`` of the one graph Dynamo hands a backend for ``model(*args)``."""
    captured: list[Any] = []

    def backend(gm: fx.GraphModule, inputs: list[Any], **_: Any):
        captured.append(keep(gm, inputs))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=dynamic)(*args)
    assert len(captured) == 1, "expected one graph (no graph breaks)"
    return captured[0]


def dynamo_graph(model: nn.Module, *args: torch.Tensor, dynamic: bool = False) -> fx.GraphModule:
    """The one graph Dynamo captures of ``model(*args)``, as a backend receives it."""
    return _dynamo_capture(model, args, dynamic, lambda gm, inputs: gm)


def dynamo_frozen(
    model: nn.Module, *args: torch.Tensor, dynamic: bool = False
) -> tuple[fx.GraphModule, list[Any]]:
    """The one graph Dynamo captures of ``model(*args)``, frozen by the library's :func:`freeze`.

    Returns:
        The frozen GraphModule and the inputs it still takes (user inputs, maybe sizes).
    """

    def frozen(gm: fx.GraphModule, inputs: list[Any]) -> tuple[fx.GraphModule, list[Any]]:
        result = freeze(gm, inputs)  # now: Dynamo drops the placeholders' sources later
        return result.gm, [inputs[i] for i in result.user_inputs]

    return _dynamo_capture(model, args, dynamic, frozen)


def random_batches(shape: tuple[int, ...], n: int = 3, seed: int = 0) -> list[torch.Tensor]:
    """``n`` standard-normal batches of ``shape`` from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen) for _ in range(n)]


def called_module(gm: fx.GraphModule, node: Any) -> nn.Module | None:
    """The module ``node`` calls (None for any other node)."""
    if isinstance(node, fx.Node) and node.op == "call_module":
        return gm.get_submodule(node.target)
    return None


def is_fake_quant(gm: fx.GraphModule, node: Any) -> bool:
    """Whether ``node`` is the output of an activation fake-quant module."""
    return isinstance(called_module(gm, node), FakeQuantize)


def plan_table(plan: TransformationPlan) -> str:
    """``print(plan)`` without the FX node column: id, pattern, apply, reason per entry."""
    rows = [("id", "pattern", "apply", "reason")]
    for e in plan.entries:
        state = "applied" if e.applied else ("yes" if e.apply else "no")
        rows.append((e.id, e.pattern.name, state, e.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# artifacts built (not loaded from a cache) since the last clear, per kind: filled by the
# wrappers :func:`count_builds` puts around the library's real builders
BUILD_COUNTS: collections.Counter[str] = collections.Counter()
_count_lock = threading.Lock()

# (module, function, kind): a finished call of the function is one build of that kind
_BUILDERS = (
    ("embedl_dynamo.onnx.artifact", "export_onnx_unwritten", "onnx"),
    ("embedl_dynamo.runtimes.tensorrt.runtime", "build_engine", "trt_engine"),
    ("embedl_dynamo.dynamo.refit", "refit_artifact", "refit"),
)


def _counted(kind: str, build: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(build)
    def counting(*args: Any, **kwargs: Any) -> Any:
        result = build(*args, **kwargs)
        with _count_lock:
            BUILD_COUNTS[kind] += 1
        return result

    return counting


def count_builds(set_attr: Callable[[Any, str, Any], None] = setattr) -> None:
    """Wrap the library's builders so each build adds one to ``BUILD_COUNTS[kind]``.

    Kinds: ``onnx`` (an ONNX export), ``trt_engine`` (a TensorRT engine), ``torch_tensorrt`` (a
    module compiled by Torch-TensorRT's backend), ``refit`` (new weights written into a built
    artifact). Builds answered from the cache call none of them.

    Args:
        set_attr: how to replace a module attribute (``monkeypatch.setattr`` undoes it later).
    """
    for module_name, name, kind in _BUILDERS:
        module = importlib.import_module(module_name)
        set_attr(module, name, _counted(kind, getattr(module, name)))
    trt = importlib.import_module("embedl_dynamo.runtimes.torch_tensorrt.runtime")
    backend = trt.torch_tensorrt_backend

    @functools.wraps(backend)
    def counted_backend() -> Callable[..., Any]:
        return _counted("torch_tensorrt", backend())

    set_attr(trt, "torch_tensorrt_backend", counted_backend)


# transformers' config and model class of each tiny decoder :func:`tiny_decoder` builds, and
# the config fields its defaults would put outside the tiny vocabulary
_DECODERS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "eos_token_id": None}),
}
DECODER_VOCAB = 100


def tiny_decoder(name: str, kv_heads: int = 2, **config: Any) -> nn.Module:
    """A seeded random-init ``*ForCausalLM`` of transformers' own classes, in eval mode: hidden
    64, 2 layers, 4 query heads, ``kv_heads`` key/value heads, a vocabulary of 100 (no download).

    Args:
        name: ``llama``, ``qwen2``, ``mistral`` or ``phi3``.
        kv_heads: key/value heads (4 multi-head, 2 grouped-query, 1 multi-query).
        config: further config fields (``sliding_window``, ``partial_rotary_factor``, ...).
    """
    import transformers  # only the tests that build a decoder need it

    config_name, model_name, fixed = _DECODERS[name]
    kw = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        vocab_size=DECODER_VOCAB,
    )
    torch.manual_seed(0)
    model_config = getattr(transformers, config_name)(**{**kw, **fixed, **config})
    return getattr(transformers, model_name)(model_config).eval()


def moved_weights(model: nn.Module, seed: int) -> nn.Module:
    """``model`` with every parameter moved by ``0.02 * randn`` from a generator seeded with
    ``seed`` (0: unchanged), in place: new weights of the same architecture."""
    if seed:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    return model


def runtime_compiled(model: Any, runtime: str, **options: Any) -> Any:
    """``model`` compiled afresh (Dynamo reset) for the CPU ``runtime``, pinned to it, with
    ``beat_eager=False`` so that a small graph is not timed back into PyTorch."""
    torch._dynamo.reset()
    options = {"runtime": runtime, "beat_eager": False, **options}
    return torch.compile(model, backend=f"embedl_{runtime}", options=options)


def greedy_generate(model: nn.Module, ids: torch.Tensor, new_tokens: int, **kw: Any) -> Any:
    """``model.generate`` of ``new_tokens`` greedy tokens, without grad or warnings."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, **kw)


def left_padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of 8 and 5 tokens, the shorter one left-padded as tokenizers pad for
    generation: the token ids and the attention mask."""
    ids = torch.randint(1, DECODER_VOCAB, (2, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 8, dtype=torch.long)
    ids[1, :3], mask[1, :3] = 0, 0
    return ids, mask


def replace_cache_file(path: Any, data: bytes) -> None:
    """Write ``data`` over a cache entry's file and re-sign its checksum sidecar to match: an
    entry whose bytes are valid but not what its key promises (a wrong artifact)."""
    import json
    from pathlib import Path

    from embedl_dynamo.cache.digests import DIGEST, blake3_digest

    path = Path(path)
    path.write_bytes(data)
    meta = path.with_name(path.name + ".meta.json")
    record = json.loads(meta.read_text())
    record.update({DIGEST: blake3_digest(data).hex(), "size": len(data)})
    meta.write_text(json.dumps(record))


def wait_until_stored() -> None:
    """Wait for the builds' artifacts to reach the cache before a test changes weights in place:
    an artifact whose weights change while it is written is not stored (its file would hold
    neither set), so the next weights are then built anew, not refitted, which a test counting
    refits would take for a defect (a loaded machine writes slowly)."""
    wait_for_cache_writes(timeout=60)
