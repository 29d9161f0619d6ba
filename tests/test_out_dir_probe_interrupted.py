"""A Ctrl-C or SIGTERM that lands while --out's write probe exists (out_dirs._probe_writable) waits
until the probe is removed, so an interrupted command leaves no hidden probe file behind (seen on the
GPU machine: `profile` under SIGTERM left .salactl-probe.* in the nearest existing directory)."""

import os
import signal
import tempfile

import pytest

from salactl.out_dirs import directory_option


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_during_the_write_probe_leaves_no_probe_file(tmp_path, monkeypatch, sig):
    real_mkstemp = tempfile.mkstemp
    raised = []

    def mkstemp_then_signal(*args, **kwargs):
        made = real_mkstemp(*args, **kwargs)
        os.kill(os.getpid(), sig)                   # handled at the next bytecode, in this thread
        return made

    def terminated(signum, frame):
        raise SystemExit(128 + signum)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp_then_signal)
    previous = signal.signal(signal.SIGTERM, terminated)     # as the CLI's handler ends the command
    try:
        with pytest.raises((KeyboardInterrupt, SystemExit)) as info:
            directory_option(tmp_path / "new" / "out")
        raised.append(info.type)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert raised == [KeyboardInterrupt if sig == signal.SIGINT else SystemExit]
    assert list(tmp_path.iterdir()) == []
