"""The CLI's start: help without torch, and an interrupt during the imports ends like any other
(one line, exit 130 / 143, no traceback)."""

import signal
import subprocess
import sys

import pytest

COMMANDS = ["", "run", "info", "eval", "quantize", "bench", "sweep", "profile", "report"]
ENDINGS = [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]


def test_help_does_not_import_torch():
    code = ("import contextlib, io, sys\n"
            "from salactl.cli import main\n"
            f"for command in {COMMANDS!r}:\n"
            "    sys.argv = ['salactl', *command.split(), '--help']\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        main()\n"
            "print('torch' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def _signal_while_importing(module: str, signal_name: str) -> subprocess.CompletedProcess:
    """`salactl run` through the real main(), sent the signal as soon as `module` starts loading."""
    code = ("import os, signal, sys, threading, time\n"
            "def send():\n"
            f"    while {module!r} not in sys.modules:\n"
            "        time.sleep(0.0005)\n"
            f"    os.kill(os.getpid(), signal.{signal_name})\n"
            "threading.Thread(target=send, daemon=True).start()\n"
            "sys.argv = ['salactl', 'run', '--prompt', 'hi', '-n', '2', '--device', 'cpu']\n"
            "from salactl.cli import main\n"
            "main()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("signal_name,code,line", ENDINGS)
def test_signal_inside_torchs_import_is_not_lost(signal_name, code, line):
    """numpy loads inside torch's C initialisation, which swallows a KeyboardInterrupt raised there
    (the command then ran to the end, exit 0): the signal is held until torch is imported."""
    p = _signal_while_importing("numpy", signal_name)
    assert (p.returncode, p.stderr.strip()) == (code, line)
    assert p.stdout == ""


@pytest.mark.parametrize("signal_name,code,line", ENDINGS)
def test_signal_while_the_cli_module_loads_gives_one_line(signal_name, code, line):
    p = _signal_while_importing("typer", signal_name)
    assert (p.returncode, p.stderr.strip()) == (code, line)
    assert "Traceback" not in p.stderr


def test_an_ignored_ctrl_c_stays_ignored():
    """`trap '' INT` or a background job of a script: SIGINT arrives ignored and must stay so."""
    p = subprocess.Popen([sys.executable, "-m", "salactl", "run", "--prompt", "hi", "-n", "300", "--ignore-eos",
                          "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        p.stdout.read(20)                      # generating; then Ctrl-C, which it ignores
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and b"interrupted" not in err, err[-300:]


def test_a_host_importing_the_app_keeps_its_signal_handlers():
    """A test runner or notebook imports salactl.cli: its handlers stay in place, also when the
    import fails half way (no os._exit handler left behind)."""
    code = ("import signal, sys\n"
            "def host(signum, frame):\n"
            "    pass\n"
            "signal.signal(signal.SIGINT, host)\n"
            "sys.modules['salactl.cmd_report'] = None\n"          # an import inside the app fails
            "try:\n"
            "    import salactl.cli\n"
            "except ImportError:\n"
            "    pass\n"
            "print(signal.getsignal(signal.SIGINT) is host)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr
