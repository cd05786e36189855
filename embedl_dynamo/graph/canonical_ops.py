"""The canonical operator set: one target and one keyword signature per operation.

Every graph the pattern engine sees is first rewritten so that each supported operation is a
``call_function`` node whose target is the canonical callable below and whose inputs are passed
**by keyword only**, with defaults filled in. ``F.relu(x)``, ``torch.relu(x)``, ``x.relu()``,
``nn.ReLU()(x)`` all become ``torch.relu(input=x)``; a pattern written with any spelling is
canonicalised the same way, so one pattern covers them all and code reads ``kwargs["weight"]``,
never ``args[1]``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "COMMUTATIVE",
    "SIGNATURES",
    "contiguous",
    "identity",
    "signature_of",
]


def identity(input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - mirrors torch's argument name
    """Return ``input`` unchanged: the canonical form of ``nn.Identity`` and friends."""
    return input


def contiguous(
    input: torch.Tensor,  # noqa: A002
    memory_format: torch.memory_format = torch.contiguous_format,
) -> torch.Tensor:
    """``input.contiguous(memory_format)``: not a no-op, since a later ``view`` may need it
    (ShuffleNet's channel shuffle: ``transpose -> contiguous -> view``)."""
    return input.contiguous(memory_format=memory_format)


_REQUIRED = inspect.Parameter.empty

# canonical target -> ordered (name, default) pairs. ``_REQUIRED`` marks arguments without default.
SIGNATURES: dict[Callable[..., Any], tuple[tuple[str, Any], ...]] = {
    torch.conv1d: (
        ("input", _REQUIRED),
        ("weight", _REQUIRED),
        ("bias", None),
        ("stride", 1),
        ("padding", 0),
        ("dilation", 1),
        ("groups", 1),
    ),
    torch.conv2d: (
        ("input", _REQUIRED),
        ("weight", _REQUIRED),
        ("bias", None),
        ("stride", 1),
        ("padding", 0),
        ("dilation", 1),
        ("groups", 1),
    ),
    torch.conv3d: (
        ("input", _REQUIRED),
        ("weight", _REQUIRED),
        ("bias", None),
        ("stride", 1),
        ("padding", 0),
        ("dilation", 1),
        ("groups", 1),
    ),
    F.linear: (("input", _REQUIRED), ("weight", _REQUIRED), ("bias", None)),
    torch.matmul: (("input", _REQUIRED), ("other", _REQUIRED)),
    torch.addmm: (
        ("input", _REQUIRED),
        ("mat1", _REQUIRED),
        ("mat2", _REQUIRED),
        ("beta", 1),
        ("alpha", 1),
    ),
    torch.relu: (("input", _REQUIRED),),
    torch.sigmoid: (("input", _REQUIRED),),
    torch.tanh: (("input", _REQUIRED),),
    F.relu6: (("input", _REQUIRED),),
    F.silu: (("input", _REQUIRED),),
    F.hardswish: (("input", _REQUIRED),),
    F.hardsigmoid: (("input", _REQUIRED),),
    F.gelu: (("input", _REQUIRED), ("approximate", "none")),
    torch.add: (("input", _REQUIRED), ("other", _REQUIRED), ("alpha", 1)),
    torch.mul: (("input", _REQUIRED), ("other", _REQUIRED)),
    torch.flatten: (("input", _REQUIRED), ("start_dim", 0), ("end_dim", -1)),
    F.max_pool2d: (
        ("input", _REQUIRED),
        ("kernel_size", _REQUIRED),
        ("stride", None),
        ("padding", 0),
        ("dilation", 1),
        ("ceil_mode", False),
        ("return_indices", False),
    ),
    F.adaptive_avg_pool2d: (("input", _REQUIRED), ("output_size", _REQUIRED)),
    F.batch_norm: (
        ("input", _REQUIRED),
        ("running_mean", _REQUIRED),
        ("running_var", _REQUIRED),
        ("weight", None),
        ("bias", None),
        ("training", False),
        ("momentum", 0.1),
        ("eps", 1e-5),
    ),
    F.layer_norm: (
        ("input", _REQUIRED),
        ("normalized_shape", _REQUIRED),
        ("weight", None),
        ("bias", None),
        ("eps", 1e-5),
    ),
    F.dropout: (("input", _REQUIRED), ("p", 0.5), ("training", True), ("inplace", False)),
    F.softmax: (("input", _REQUIRED), ("dim", None), ("_stacklevel", 3), ("dtype", None)),
    F.scaled_dot_product_attention: (
        ("query", _REQUIRED),
        ("key", _REQUIRED),
        ("value", _REQUIRED),
        ("attn_mask", None),
        ("dropout_p", 0.0),
        ("is_causal", False),
        ("scale", None),
        ("enable_gqa", False),
    ),
    identity: (("input", _REQUIRED),),
    contiguous: (("input", _REQUIRED), ("memory_format", torch.contiguous_format)),
}


def _signature_from_python(fn: Callable[..., Any]) -> tuple[tuple[str, Any], ...]:
    params = inspect.signature(fn).parameters.values()
    return tuple((p.name, p.default) for p in params)


# Python-level functions whose own signature is the canonical one.
for _fn in (F.multi_head_attention_forward,):
    SIGNATURES[_fn] = _signature_from_python(_fn)

# ``torch._transformer_encoder_layer_fwd`` is what Dynamo records for ``nn.TransformerEncoderLayer``
# in inference (its "fast path"); it is a builtin, so its signature is spelled out here.
SIGNATURES[torch._transformer_encoder_layer_fwd] = (
    ("src", _REQUIRED),
    ("embed_dim", _REQUIRED),
    ("num_heads", _REQUIRED),
    ("qkv_weight", _REQUIRED),
    ("qkv_bias", _REQUIRED),
    ("proj_weight", _REQUIRED),
    ("proj_bias", _REQUIRED),
    ("use_gelu", _REQUIRED),
    ("norm_first", _REQUIRED),
    ("eps", _REQUIRED),
    ("norm_weight_1", _REQUIRED),
    ("norm_bias_1", _REQUIRED),
    ("norm_weight_2", _REQUIRED),
    ("norm_bias_2", _REQUIRED),
    ("ffn_weight_1", _REQUIRED),
    ("ffn_bias_1", _REQUIRED),
    ("ffn_weight_2", _REQUIRED),
    ("ffn_bias_2", _REQUIRED),
    ("mask", None),
    ("mask_type", None),
)

# Targets whose first two inputs may be swapped without changing the result.
COMMUTATIVE: dict[Callable[..., Any], tuple[str, str]] = {
    torch.add: ("input", "other"),
    torch.mul: ("input", "other"),
}


def signature_of(target: Callable[..., Any]) -> tuple[tuple[str, Any], ...] | None:
    """The canonical ``(name, default)`` signature of ``target``, or None if not canonical."""
    return SIGNATURES.get(target)


def bind(target: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """Bind ``args``/``kwargs`` to the canonical signature of ``target``, filling defaults.

    Returns None when the call does not fit the signature (too many positional arguments, an
    unknown keyword or a missing required argument): such a node is left as it is.
    """
    signature = SIGNATURES.get(target)
    if signature is None or len(args) > len(signature):
        return None
    names = [name for name, _ in signature]
    if any(k not in names for k in kwargs):
        return None
    bound: dict[str, Any] = {}
    for (name, default), position in zip(signature, range(len(signature))):
        if position < len(args):
            if name in kwargs:
                return None
            bound[name] = args[position]
        elif name in kwargs:
            bound[name] = kwargs[name]
        elif default is _REQUIRED:
            return None
        else:
            bound[name] = default
    return bound
