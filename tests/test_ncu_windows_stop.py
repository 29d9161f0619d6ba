"""How `profile --ncu` starts and stops ncu's process group on each platform. Only the platform
name is chosen here: the Windows branch (CTRL_BREAK_EVENT to a new console process group, then
proc.kill()) is checked as the decision it makes, since this machine cannot run it; the POSIX one
also runs for real (test_ncu_failures.py interrupts a whole run)."""

import os
import signal
import subprocess
import sys

import pytest

from salactl.profiling.ncu_runner import STOP_GRACE_S, group_popen_kwargs, stop_signals


def test_windows_starts_ncu_in_a_new_console_process_group():
    """Not start_new_session (POSIX-only): CREATE_NEW_PROCESS_GROUP, Windows' 0x200."""
    assert group_popen_kwargs("nt") == {"creationflags": 0x200}


def test_windows_stops_with_ctrl_break_for_the_whole_grace_period_then_the_kill():
    """No SIGINT/SIGTERM/SIGKILL or killpg there: one CTRL_BREAK_EVENT (Ctrl-C does not reach a
    new process group), then proc.kill() after the grace that POSIX spreads over two signals."""
    assert stop_signals("nt") == [("CTRL_BREAK_EVENT", sum(STOP_GRACE_S))]


def test_posix_keeps_its_own_session_and_the_sigint_sigterm_escalation():
    assert group_popen_kwargs("posix") == {"start_new_session": True}
    assert stop_signals("posix") == [("SIGINT", 3.0), ("SIGTERM", 2.0)]


@pytest.mark.skipif(os.name != "posix", reason="process groups as POSIX has them")
def test_here_ncu_leads_a_process_group_of_its_own():
    assert all(hasattr(signal, name) for name, _ in stop_signals())
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], **group_popen_kwargs())
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    finally:
        proc.kill()
        proc.wait()
