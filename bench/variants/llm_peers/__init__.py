"""The LLM peers of the ``llm_decode`` suite, each in its own venv, driven as a subprocess.

llama.cpp (``llama-cpp-python``, built for this CPU) and OpenVINO through optimum-intel pin
packages that clash with ours, so each lives in a venv of its own under
``$EMBEDL_BENCH_PEERS`` (default ``~/.cache/embedl_dynamo_bench/peers``), made by
``bash bench/peers_setup.sh``. The suite names a peer's variant ``<peer>-<variant>``
(``llama.cpp-q4_0``, ``openvino-int4``); :func:`start_peers` starts one process per peer on
the model the suite saved, and each :class:`Peer` times itself one round at a time between
our variants (an ``external`` block of :func:`bench.harness.timer.interleaved`), over the line
protocol of :mod:`.protocol`; its rows name it as their ``tool``. A peer whose venv is missing
is skipped with one line naming the command that makes it. This package imports only the
standard library: the peers' environments import it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PEERS", "Peer", "PeerSpec", "peers_dir", "split_variants", "start_peers"]

REPOSITORY = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class PeerSpec:
    """One peer: its name in variant names, its venv, the module it runs, its variants."""

    name: str
    venv: str
    module: str
    variants: tuple[str, ...]

    def python(self) -> Path:
        return peers_dir() / self.venv / "bin" / "python"


PEERS = (
    PeerSpec(
        "llama.cpp", "llama_cpp", "bench.variants.llm_peers.llama_cpp", ("f32", "q8_0", "q4_0")
    ),
    PeerSpec(
        "openvino",
        "optimum_intel",
        "bench.variants.llm_peers.optimum_intel",
        ("fp32", "default", "int8", "int4", "int8-f32", "int4-f32"),
    ),
)

# the peers' variants that compute in float32: their tokens are compared with eager's
FLOAT_VARIANTS = {"llama.cpp-f32", "openvino-fp32"}


def peers_dir() -> Path:
    """Where the peers' venvs live (``$EMBEDL_BENCH_PEERS`` or the user's cache)."""
    default = Path.home() / ".cache" / "embedl_dynamo_bench" / "peers"
    return Path(os.environ.get("EMBEDL_BENCH_PEERS", default)).expanduser()


def split_variants(names: Sequence[str]) -> tuple[list[str], dict[PeerSpec, list[str]]]:
    """Our variant names, and each peer's variants, from the suite's ``--variants``.

    Raises:
        ValueError: a ``<peer>-<variant>`` name whose variant that peer does not have.
    """
    ours, peers = [], {}
    for name in names:
        spec = next((s for s in PEERS if name.startswith(s.name + "-")), None)
        if spec is None:
            ours.append(name)
            continue
        variant = name.removeprefix(spec.name + "-")
        if variant not in spec.variants:
            raise ValueError(
                f"{spec.name} has no variant {variant!r} (it has: {', '.join(spec.variants)})"
            )
        peers.setdefault(spec, []).append(variant)
    return ours, peers


class PeerDied(RuntimeError):
    """The peer process ended or answered with an error."""


class Peer:
    """One running peer process (see :mod:`.protocol`); ``info`` holds what it
    announced for each variant, under the variant's full name (``llama.cpp-q4_0``)."""

    def __init__(self, spec: PeerSpec, command: list[str]) -> None:
        self.spec = spec
        self.process = subprocess.Popen(
            command, cwd=REPOSITORY, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.info = {self.full(k): v for k, v in self._read()["ready"].items()}

    def full(self, variant: str) -> str:
        return f"{self.spec.name}-{variant}"

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise PeerDied(f"{self.spec.name} peer exited (status {self.process.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise PeerDied(f"{self.spec.name} peer: {answer['error']}")
        return answer

    def _ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._read()

    def time_round(self, index: int, prompt: list[int], tokens: list[int]) -> dict:
        """(full variant name, tokens) -> seconds of one round of every variant."""
        answer = self._ask({"round": index, "prompt": prompt, "tokens": tokens})["times"]
        return {
            (self.full(v), int(n)): s for v, counts in answer.items() for n, s in counts.items()
        }

    def generate(self, prompt: list[int], tokens: int) -> dict[str, list[int]]:
        """Full variant name -> the ``tokens`` new token ids each generates after ``prompt``."""
        answer = self._ask({"generate": prompt, "tokens": tokens})["generated"]
        return {self.full(v): ids for v, ids in answer.items()}

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self._ask({"exit": True})
            except (PeerDied, BrokenPipeError, ValueError):
                pass
            self.process.wait(timeout=60)


def start_peers(
    wanted: dict[PeerSpec, list[str]], model_dir: str, work_dir: str, threads: int, context: int
) -> list[Peer]:
    """Start each wanted peer on the ``save_pretrained`` model in ``model_dir`` and wait until
    its variants are built; a peer without its venv, or one that fails, is skipped with one
    printed line."""
    peers = []
    for spec, variants in wanted.items():
        python = spec.python()
        if not python.exists():
            print(
                f"{spec.name} rows skipped: no venv at {python.parent.parent}; make it with "
                f"`bash bench/peers_setup.sh {spec.venv}`"
            )
            continue
        command = [
            str(python),
            "-m",
            spec.module,
            "--serve",
            "--model-dir",
            model_dir,
            "--threads",
            str(threads),
            "--variants",
            *variants,
        ]
        if spec.name == "llama.cpp":
            command += ["--work-dir", work_dir, "--context", str(context)]
        try:
            peers.append(Peer(spec, command))
        except PeerDied as error:
            print(
                f"{spec.name} rows skipped: {error} (an incomplete venv? re-run "
                f"`bash bench/peers_setup.sh {spec.venv}`)"
            )
    return peers
