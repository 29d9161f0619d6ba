"""A SIGTERM whose Terminated is raised inside a weakref callback (as in importlib's module-lock
cleanup during a lazy import) is swallowed by Python ("Exception ignored in ...") and the program
runs on; salactl's handlers deliver it again, so it still ends the command."""

import subprocess
import sys

import pytest

SCRIPT = """
import signal, sys, time, weakref
from salactl import cli

cli._install_interrupt_handlers()

class Thing:
    pass

def callback(ref):
    signal.raise_signal(signal.SIGTERM)      # the handler raises Terminated here, inside the callback

thing = Thing()
keep = weakref.ref(thing, callback)
try:
    del thing
    for _ in range(1000):           # the command's work goes on: 10 s unless the signal ends it
        time.sleep(0.01)
    print("ran on")
except cli.Terminated:
    print("terminated")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="signal.raise_signal(SIGTERM) ends a Windows process at once")
def test_a_termination_swallowed_by_a_weakref_callback_still_ends_the_program():
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "terminated", (p.stdout, p.stderr)
    assert "Exception ignored" not in p.stderr
