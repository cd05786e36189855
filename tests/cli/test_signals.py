"""SIGTERM stops a long-running command as Ctrl-C does (``embedl-dynamo serve`` under a process
manager), and the handler before it is restored."""

from __future__ import annotations

import os
import signal

import pytest

from embedl_dynamo.cli.signals import sigterm_interrupts


def test_sigterm_raises_keyboard_interrupt_within_the_block_only():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 5)  # not reached: the handler runs at the next bytecode
    assert signal.getsignal(signal.SIGTERM) is before
