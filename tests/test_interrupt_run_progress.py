"""Ctrl-C or SIGTERM during `salactl run`'s prefill bar on a terminal: the bar is erased and the
cursor shown again before the one-line "interrupted" / "terminated"."""

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

HIDE_CURSOR, SHOW_CURSOR = b"\x1b[?25l", b"\x1b[?25h"


def _run_on_a_terminal(prompt_file, sig) -> tuple[int, bytes]:
    """`salactl run` with stdin/stdout/stderr on a pty; `sig` as soon as the bar shows a count."""
    master, slave = os.openpty()
    env = dict(os.environ, TERM="xterm", COLUMNS="100", LINES="40")
    p = subprocess.Popen([sys.executable, "-m", "salactl", "run", "--prompt-file", str(prompt_file), "-n", "4",
                          "--chunk-size", "256", "--device", "cpu"],
                         stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    screen, sent, deadline = b"", False, time.time() + 120
    try:
        while time.time() < deadline:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:             # EIO: the child closed its side
                    break
                if not data:
                    break
                screen += data
            if not sent and re.search(rb"\d+/\d+", screen):
                p.send_signal(sig)
                sent = True
        return p.wait(timeout=30), screen
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)


@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, b"interrupted"),
                                             (signal.SIGTERM, 143, b"terminated")])
def test_an_interrupted_prefill_erases_its_bar_and_shows_the_cursor(tmp_path, sig, code, line):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("def f(x):\n    return x * 2\n" * 400)          # ~4800 tokens: many chunks
    rc, screen = _run_on_a_terminal(prompt, sig)
    assert rc == code, screen[-400:]
    assert HIDE_CURSOR in screen and SHOW_CURSOR in screen[screen.rindex(HIDE_CURSOR):], screen[-400:]
    assert screen.rindex(line) > screen.rindex(b"prefill tokens"), screen[-400:]     # no bar after it


def test_an_interrupt_mid_stream_ends_the_text_line(tmp_path):
    """Ctrl-C while generated text streams: stdout ends its cut line, so "interrupted" (stderr) is
    not glued to the text on a terminal."""
    p = subprocess.Popen([sys.executable, "-m", "salactl", "run", "--prompt", "def fibonacci(n):", "-n", "2000",
                          "--ignore-eos", "--device", "cpu"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        first = p.stdout.read(40)                 # streamed text has started
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err[-400:]
    assert (first + rest).endswith(b"\n") and err.strip().endswith(b"interrupted"), (first + rest)[-80:]
