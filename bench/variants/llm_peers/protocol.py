"""The line protocol between the ``llm_decode`` suite and a peer process (standard library only).

A peer (llama.cpp, OpenVINO through optimum-intel) runs in its own virtual environment, so
the suite starts it as a subprocess and times it round by round beside our variants.
The peer builds its variants, then answers one JSON line per JSON line it reads on stdin:

* it first writes ``{"ready": {variant: info}}`` (each info a dict: ``weight_bytes``, the
  bytes a decode step reads, ``first_generate_s``, ...);
* ``{"round": r, "prompt": [ids], "tokens": [1, 32, 128]}`` -> ``{"times": {variant:
  {tokens: seconds}}}``: each variant generates each count of new tokens once, greedy, the
  variants in an order rotated by ``r``, timed by the harness's one timer
  (:func:`bench.harness.timer.interleaved`, which needs only the standard library);
* ``{"generate": [ids], "tokens": n}`` -> ``{"generated": {variant: [n token ids]}}``;
* ``{"exit": true}`` ends the peer.

A peer's libraries may print to file descriptor 1 (C code included): :func:`serve` moves the
protocol to a private copy of it and points 1 at stderr, so only protocol lines reach the
parent. A variant is any object with ``generate(prompt, tokens) -> list[int]``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

from bench.harness.timer import interleaved

__all__ = ["PeerVariant", "protocol_stream", "serve", "time_round"]


class PeerVariant(Protocol):
    """What a peer times: greedy generation of ``tokens`` new token ids after ``prompt``."""

    def generate(self, prompt: Sequence[int], tokens: int) -> list[int]: ...


def protocol_stream():
    """A text stream on a private copy of stdout; file descriptor 1 then points at stderr."""
    sys.stdout.flush()
    private = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(private, "w", buffering=1)


def time_round(
    variants: Mapping[str, PeerVariant], prompt: Sequence[int], tokens: Sequence[int], shift: int
) -> dict[str, dict[int, float]]:
    """Seconds of each (variant, new-token count), one call each, variants rotated by
    ``shift`` (round ``shift`` of the one timer, each variant's counts as one block)."""
    calls = {
        (name, count): partial(variant.generate, prompt, count)
        for name, variant in variants.items()
        for count in tokens
    }
    timings = interleaved(calls, 1, warmup=0, repeat=1, group=lambda key: key[0], first_round=shift)
    times: dict[str, dict[int, float]] = {}
    for (name, count), seconds in timings.medians().items():
        times.setdefault(name, {})[count] = seconds
    return times


def serve(build: Callable[[], tuple[dict[str, PeerVariant], dict[str, dict[str, Any]]]]) -> None:
    """Build the variants (``build`` returns name -> variant and name -> info), announce them,
    then answer requests from stdin until ``exit`` or the end of input."""
    out = protocol_stream()
    variants, info = build()
    out.write(json.dumps({"ready": info}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("exit"):
            break
        if "round" in request:
            times = time_round(variants, request["prompt"], request["tokens"], request["round"])
            out.write(json.dumps({"times": times}) + "\n")
        elif "generate" in request:
            generated = {
                n: v.generate(request["generate"], request["tokens"]) for n, v in variants.items()
            }
            out.write(json.dumps({"generated": generated}) + "\n")
        else:
            out.write(json.dumps({"error": f"unknown request {sorted(request)}"}) + "\n")
