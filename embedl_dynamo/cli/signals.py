"""Stopping a long-running command the way it is asked to: Ctrl-C, or SIGTERM from a process
manager (Kubernetes, systemd, ``docker stop``), which gives the process a grace period before
SIGKILL. Python turns only SIGINT into :class:`KeyboardInterrupt`; without a handler, SIGTERM
ends the process at once, and what it started (Ray's processes) is left running."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

__all__ = ["sigterm_interrupts"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`KeyboardInterrupt` in the main thread, as
    Ctrl-C does, so one ``except KeyboardInterrupt`` stops the command cleanly for both; the
    previous handler is restored after. Outside the main thread it changes nothing (Python
    installs signal handlers there only)."""
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
