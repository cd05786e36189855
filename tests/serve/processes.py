"""Which processes a test started and what they listen on, read from /proc: a server's every
Ray process, and its TCP listening sockets, so a test can check that all of them are on
loopback and that all of them end; and a scenario run as a process of its own under a time
limit (:func:`run_scenario`), so that nothing of a Ray instance outlives its test."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

__all__ = ["address_of", "alive", "descendants", "free_port", "listening", "run_scenario"]

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_scenario(
    module: str,
    args: list[str],
    time_limit_s: float,
    env: Mapping[str, str | None] | None = None,
) -> dict:
    """The JSON line ``python -m module *args`` prints last, run from the repository root in a
    process group of its own, with ``env`` over this process's environment (None removes a
    name). The test fails with the scenario's stderr where it exits non-zero or runs past
    ``time_limit_s``; either way its group is killed when it ends, so no process it started
    (a Ray instance's included) outlives it."""
    full = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    child = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=time_limit_s)
    except subprocess.TimeoutExpired:
        out, err = "", ""
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
    if child.returncode is None:
        out, err = child.communicate()
        pytest.fail(f"{module} ran over {time_limit_s} s:\n{err[-3000:]}")
    assert child.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # the ppid: the second field after the command name in parentheses
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo.extend(c for c in children.get(current, []) if c not in found)
    return found


def address_of(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A /proc/net/tcp{,6} address (each 32-bit word in host order, little-endian here)."""
    raw = bytes.fromhex(hex_address)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def listening(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the processes ``pids`` listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                host, port = fields[1].split(":")
                found.append((str(address_of(host)), int(port, 16)))
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (not zombies)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive
