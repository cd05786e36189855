"""SIGTERM stops a long-running command as Ctrl-C does (``embedl-dynamo serve`` under a process
manager), and the handler before it is restored. Checked in a child process: the signal goes
to that process alone (a test worker may not run tests in its main thread, where Python
installs handlers)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

CHILD = """
import signal, sys, time
from embedl_dynamo.cli.signals import sigterm_interrupts
before = signal.getsignal(signal.SIGTERM)
try:
    with sigterm_interrupts():
        print("waiting", flush=True)
        time.sleep(60)
except KeyboardInterrupt as exc:
    print(f"interrupted by {exc}", flush=True)
print("restored" if signal.getsignal(signal.SIGTERM) is before else "not restored", flush=True)
"""


def test_sigterm_raises_keyboard_interrupt_within_the_block_and_restores_the_handler():
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "waiting"
        start = time.monotonic()
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    assert out.split("\n")[:2] == ["interrupted by signal SIGTERM", "restored"]
    assert time.monotonic() - start < 30
