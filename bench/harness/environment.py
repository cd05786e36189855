"""The environment block of a result record: what ran, where, when, from which commit.

TorchBench writes one beside every metrics file; pyperf's ``compare_to`` shows where two
runs' blocks differ. Ours holds the versions of torch, ONNX Runtime, OpenVINO and NNCF (and
the model libraries) where installed, the CPU's model, cores and the instruction-set flags the
runtimes choose kernels by, PyTorch's thread count, the commit (and whether the tree had
changes), the date and the command. ``machine`` is the one line a docs table shows.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["PACKAGES", "cpu", "environment", "git_commit", "machine_line", "versions"]

REPOSITORY = Path(__file__).resolve().parents[2]

# distributions whose versions a record names where they are installed
PACKAGES = (
    "torch",
    "onnxruntime",
    "openvino",
    "nncf",
    "embedl-dynamo",
    "transformers",
    "timm",
    "torchvision",
    "onnx",
)
# the flags the CPU runtimes pick kernels by
FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


def versions() -> dict[str, str]:
    """Distribution -> version, for each of :data:`PACKAGES` that is installed."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def cpu() -> dict[str, Any]:
    """The CPU's model name, logical CPUs (and those this process may run on) and flags."""
    info: dict[str, Any] = {"model": platform.processor() or "unknown", "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            info["model"] = value.strip()
        elif key.strip() == "flags":
            present = set(value.split())
            info["flags"] = [flag for flag in FLAGS if flag in present]
            break
    info["cpus"] = os.cpu_count()
    if hasattr(os, "sched_getaffinity"):
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    return info


def git_commit() -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it), or (None, None) outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head, bool(status.strip())


def _threads() -> int | None:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def machine_line(block: dict[str, Any]) -> str:
    """The one-line description of a record's machine that a docs table shows."""
    if block.get("machine"):
        return str(block["machine"])
    processor = block.get("cpu", {})
    parts = [processor.get("model", "unknown CPU")]
    if processor.get("usable_cpus") or processor.get("cpus"):
        parts.append(f"{processor.get('usable_cpus') or processor.get('cpus')} CPUs")
    if block.get("threads"):
        parts.append(f"{block['threads']} threads")
    return ", ".join(parts)


def environment(command: str) -> dict[str, Any]:
    """The environment block of a run of ``command`` started now."""
    commit, dirty = git_commit()
    block = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "commit": commit,
        "dirty": dirty,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions(),
        "cpu": cpu(),
        "threads": _threads(),
    }
    block["machine"] = ""
    block["machine"] = machine_line(block)
    return block
