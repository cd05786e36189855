"""Canonical forms of the attention modules ``nn.MultiheadAttention`` and ``nn.TransformerEncoder``.

Filled in by the attention conversions: maps module types to rewrites that expand a
``call_module`` node into the same canonical nodes Dynamo records for that module.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import fx, nn

__all__ = ["ATTENTION_CANONICALIZERS"]

ATTENTION_CANONICALIZERS: dict[type[nn.Module], Callable[..., fx.Node | None]] = {}
