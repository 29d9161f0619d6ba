"""A thread the machine cannot start during `salactl bench --endpoint` (`ulimit -v` under big thread
stacks, run for real in a subprocess against a real loopback server): one line naming this
machine's thread limits and the concurrency to lower, exit 11, and never a request recorded as the
server's failure. Also: an HTTP target runs one watchdog thread for all its requests, gone once
the target is closed."""

import sys
import subprocess
import threading

import pytest

from bench_server import FakeServer
from salactl.bench.runner import run_phase
from salactl.bench.profiles import Phase
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.http import HttpTarget

pytestmark = [pytest.mark.usefixtures("quick_thread_switches"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")]

MIB = 2 ** 20
STACK = 512 * MIB       # each thread's stack: a few fit in the headroom below, hundreds cannot
SLACK = 256 * MIB       # the process's own allocations after the limit is set

# the modules load first; then `ulimit -v` leaves argv[1] more bytes of address space
LIMITED = """
import resource, sys, threading
import salactl.cli, salactl.cmd_bench, salactl.bench.job, salactl.bench.live, salactl.bench.targets.http
import salactl.bench.report_plots, salactl.bench.summary, numpy, rich.progress, tokenizers, torch
threading.stack_size(%d)
extra = int(sys.argv.pop(1))
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + extra, resource.RLIM_INFINITY))
sys.argv = ["salactl", *sys.argv[1:]]
salactl.cli.main()
""" % STACK


def _bench(tmp_path, threads_that_fit: float, concurrency: int) -> subprocess.CompletedProcess:
    prof = tmp_path / "p.toml"
    prof.write_text('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 4\nnum_requests = 20\n'
                    f'[[phases]]\nname = "P"\nmax_concurrency = {concurrency}\nwarmup_requests = 1\n'
                    'flush_cache = false\n')
    with FakeServer(0.0, 0.0) as srv:
        r = subprocess.run([sys.executable, "-c", LIMITED, str(int(SLACK + threads_that_fit * STACK)), "bench",
                            "--profile", str(prof), "--endpoint", srv.url, "--backend", "openai",
                            "--out", str(tmp_path / "out")],
                           capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1",
                                                                            "PATH": "/usr/bin:/bin"})
    return r


def _refusal(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 11 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    # on a GPU machine torch may warn first that CUDA cannot start under the address-space limit
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith((" ", "/"))]
    assert len(lines) == 1, r.stderr
    assert "this machine ran out of threads" in lines[0] and "`ulimit -u`" in lines[0] \
        and "`ulimit -v`" in lines[0], lines[0]
    return lines[0]


def test_no_thread_for_the_watchdog_stops_the_bench_before_any_request(tmp_path):
    line = _refusal(_bench(tmp_path, 0, 1))
    assert "starting the HTTP request watchdog" in line and "max_concurrency" in line, line
    assert not (tmp_path / "out").exists()


def test_client_threads_past_the_limit_stop_the_phase_never_fail_requests(tmp_path):
    line = _refusal(_bench(tmp_path, 3, 200))
    assert "client thread" in line and "of phase P's 20" in line and "lower phase P's max_concurrency" in line
    assert not (tmp_path / "out").exists()      # no phase finished: no record of failed requests


def test_a_thread_for_every_request_but_none_for_the_progress_bar(tmp_path):
    line = _refusal(_bench(tmp_path, 2.5, 1))     # the watchdog's and the client's, half of a third
    assert "progress bar's refresh thread" in line, line


def _watchdogs() -> list:
    return [t for t in threading.enumerate() if t.name == "salactl-http-watchdog" or isinstance(t, threading.Timer)]


def test_one_watchdog_thread_serves_every_request_and_ends_with_the_target():
    before = set(_watchdogs())      # those of targets other tests left unclosed
    with FakeServer(0.0, 0.001) as srv:
        with HttpTarget(srv.url, "openai", flush_sleep_s=0.0, read_timeout_s=60.0) as target:
            target.check()
            out = run_phase(target, Phase("P", max_concurrency=8), random_lengths(24, 4, 4, 1000))
            assert all(r.success for r in out.results) and len(out.results) == 24
            assert len(set(_watchdogs()) - before) == 1
        assert not set(_watchdogs()) - before
