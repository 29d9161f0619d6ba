"""Ctrl-C or SIGTERM arriving once a command has finished (its output complete, the interpreter
tearing down): the process ends quietly with 130 / 143, never with a traceback from torch's atexit
finalizers and exit 0; and a run refused for memory prints only its error."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import run_cli

RUN = ["run", "-p", "hi", "-n", "2", "--no-op-profile", "--device", "cpu"]
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _signalled_at_exit_via_c(sig, tmp_path) -> subprocess.CompletedProcess:
    """The real main() as the console script calls it, `sig` sent by an atexit callback registered
    after main() returns, so it runs first, before torch's finalizers."""
    code = textwrap.dedent(f"""
        import atexit, os, sys
        sys.argv = ["salactl", *{RUN!r}]
        from salactl.cli import main
        try:
            main()
        finally:
            atexit.register(os.kill, os.getpid(), {int(sig)})
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)


def _signalled_at_exit_via_m(sig, tmp_path) -> subprocess.CompletedProcess:
    """`python -m salactl`, `sig` sent by an atexit callback a sitecustomize registered at startup,
    so it runs after the ones torch registered."""
    (tmp_path / "sitecustomize.py").write_text(f"import atexit, os\natexit.register(os.kill, os.getpid(), {int(sig)})\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "salactl", *RUN], capture_output=True, text=True, timeout=180,
                          env=env)


@pytest.mark.parametrize("launch", [_signalled_at_exit_via_c, _signalled_at_exit_via_m])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_command_ends_quietly_with_its_status(tmp_path, launch, sig):
    p = launch(sig, tmp_path)
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    assert p.returncode == CODES[sig], (p.returncode, p.stderr)
    assert "decode" in p.stdout and "roofline" in p.stdout, p.stdout       # the results were complete


def test_an_in_process_main_gives_its_host_back_its_handlers(capsys):
    """A host calling main() (this test runner) keeps its own handling once main() returns."""
    before = {sig: signal.getsignal(sig) for sig in CODES}
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.startswith("salactl ")
    assert {sig: signal.getsignal(sig) for sig in CODES} == before


def test_a_run_refused_for_memory_prints_only_its_error():
    """The memory refusal (exit 11) comes before the past-max_position_embeddings warning, which
    would say "it runs" of a run that does not."""
    p = subprocess.run([sys.executable, "-m", "salactl", "run", "-p", "hi", "-n", "9223372036854775807",
                        "--no-op-profile", "--device", "cpu"], capture_output=True, text=True, timeout=180)
    assert p.returncode == 11, p.stderr
    assert p.stderr.startswith("error: ") and "warning" not in p.stderr and "it runs" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
