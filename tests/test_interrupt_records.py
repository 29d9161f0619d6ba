"""A Ctrl-C or SIGTERM that lands while a record is being saved (after its line is on disk, before
the run has counted it) or while the run's summaries are being written still leaves a consistent
set: every record in records.jsonl has the summary and per-request CSV the cleanup writes."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from bench_server import FakeServer
from salactl.bench.job import BenchSettings, run_bench
from salactl.bench.records import interrupts_deferred
from salactl.bench.sweep_job import SweepSettings, run_sweep


def _signal_after(monkeypatch, name: str, path_ends: str, sig=signal.SIGINT) -> list:
    """Wrap os.`name` (fsync: a file descriptor, replace: a source and destination) so that `sig`
    reaches this process right after the first call on a path ending in `path_ends`."""
    real = getattr(os, name)
    fired = []

    def call(*args):
        result = real(*args)
        path = os.readlink(f"/proc/self/fd/{args[0]}") if name == "fsync" else str(args[1])
        if not fired and path.endswith(path_ends):
            fired.append(path)
            signal.raise_signal(sig)
        return result

    monkeypatch.setattr(os, name, call)
    return fired


def test_a_deferred_interrupt_arrives_when_the_block_ends():
    before = signal.getsignal(signal.SIGINT)     # an in-process cli.main() earlier installs its own
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            steps.append("after the signal")
    assert steps == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is before


TWO_PHASES = ('[dataset]\nkind = "random"\ninput_len = 4\n'
              '[[phases]]\nname = "quick"\nnum_requests = 2\noutput_len = 3\nwarmup_requests = 0\n'
              '[[phases]]\nname = "next"\nnum_requests = 2\noutput_len = 3\nwarmup_requests = 0\n')


def _interrupted_bench(tmp_path) -> None:
    profile = tmp_path / "two.toml"
    profile.write_text(TWO_PHASES)
    with FakeServer(0.01, 0.005) as srv, pytest.raises(KeyboardInterrupt):
        run_bench(BenchSettings(profile=str(profile), endpoint=srv.url, flush_sleep=0.0, details=True,
                                out=tmp_path / "o"))


@pytest.mark.parametrize("again_while_summarizing", [False, True])
def test_bench_interrupted_while_saving_a_record_writes_its_summary_and_csv(tmp_path, monkeypatch,
                                                                           again_while_summarizing):
    """The interrupt lands after the first phase's record is on disk; then, maybe, a second one
    right after the markdown summary is written: the JSON summary and the CSV are still written."""
    fired = _signal_after(monkeypatch, "fsync", "records.jsonl")
    if again_while_summarizing:
        fired = _signal_after(monkeypatch, "replace", ".md")
    _interrupted_bench(tmp_path)
    assert fired
    out = tmp_path / "o"
    (record,) = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    summary = json.loads((out / f"{record['run_id']}.json").read_text())
    assert summary["interrupted"] is True and [p["phase"] for p in summary["phases"]] == ["quick"]
    assert (out / f"{record['run_id']}.md").exists()
    with open(record["details_csv"]) as f:
        assert sum(1 for _ in f) == 1 + 2            # header + the two requests of "quick"


def test_sweep_interrupted_while_saving_a_point_writes_its_summary(tmp_path, monkeypatch):
    fired = _signal_after(monkeypatch, "fsync", "records.jsonl")
    with pytest.raises(KeyboardInterrupt):
        run_sweep(SweepSettings(device="cpu", input_len=8, output_len=2, requests=1, kl=False, passkey=False,
                                topk="1,2", out=tmp_path))
    assert fired
    (record,) = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / f"{record['run_id']}-sweep.json").read_text())
    assert summary["interrupted"] is True and [p["phase"] for p in summary["points"]] == [record["phase"]]


def test_run_terminated_while_saving_keeps_prefill_and_decode_together(tmp_path):
    """SIGTERM right after the first fsync of records.jsonl: both of the run's records are there."""
    out = tmp_path / "o"
    code = textwrap.dedent(f"""
        import os, signal, sys
        real_fsync = os.fsync
        def fsync(fd):
            real_fsync(fd)
            if os.readlink(f"/proc/self/fd/{{fd}}").endswith("records.jsonl"):
                os.kill(os.getpid(), signal.SIGTERM)
        os.fsync = fsync
        sys.argv = ["salactl", "run", "--prompt", "def f(x):", "-n", "4", "--device", "cpu",
                    "--out", {str(out)!r}]
        from salactl.cli import main
        main()
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 143, p.stderr
    phases = [json.loads(line)["phase"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert phases == ["prefill", "decode"]


def test_a_signal_during_the_restore_leaves_no_handler_behind():
    """Ctrl-C landing right after the first handler is restored: the second one is restored too,
    so a later SIGTERM still ends the process (it stayed on the deferral's dead list before)."""
    code = textwrap.dedent("""
        import os, signal, sys, time
        from salactl.bench.records import interrupts_deferred
        calls = [0]
        def prof(frame, event, arg):
            if event == "return" and frame.f_code.co_name == "signal" and \\
                    frame.f_back.f_code.co_name == "interrupts_deferred":
                calls[0] += 1
                if calls[0] == 3:              # two installs, then the first restore
                    os.kill(os.getpid(), signal.SIGINT)
        try:
            sys.setprofile(prof)
            with interrupts_deferred():
                pass
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        finally:
            sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)
        print("alive")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["interrupted"] and p.returncode == -signal.SIGTERM, (p.stdout, p.stderr)
