"""An open-loop phase (a finite request_rate, no max_concurrency) against a real loopback server:
its client threads number the requests in flight, not the phase's requests, each request still
leaves at its arrival time, and the open-files check does not refuse it for its request count."""

import json
import sys
import threading
import time

import pytest

from bench_server import FakeServer, in_one_of_three_runs
from salactl.bench.open_files import OWN_FILES
from salactl.bench.profiles import Phase
from salactl.bench.runner import arrival_times, run_phase
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.http import HttpTarget
from test_bench_http_options import _bench

pytestmark = pytest.mark.usefixtures("quick_thread_switches")


def _clients() -> int:
    return sum(t.name.startswith("bench-client-") for t in threading.enumerate())


def _most_in_flight(results) -> int:
    """The most requests sent and not yet answered at any one time."""
    events = sorted([(r.start_time, 1) for r in results] + [(r.start_time + r.latency, -1) for r in results],
                    key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_a_fast_open_loop_phase_starts_threads_for_its_requests_in_flight_only():
    n, rate = 2000, 400.0
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _clients())
            time.sleep(0.002)

    with FakeServer(0.002, 0.001) as srv:
        target = HttpTarget(srv.url, "openai", flush_sleep_s=0.0, read_timeout_s=60.0)
        target.check()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        offset = time.time() - time.perf_counter()
        out = run_phase(target, Phase("P", request_rate=rate, flush_cache=False), random_lengths(n, 4, 4, 1000))
        stop.set()
        sampler.join()
        target.close()
    assert len(out.results) == n
    assert all(r.success for r in out.results), {r.error for r in out.results if not r.success}
    # one thread per request would be 2000; the threads follow the requests in flight, which a busy
    # machine (the server shares this process) lets pile up, plus the 32 idle ones started ahead
    assert 0 < peak[0] < max(n // 4, _most_in_flight(out.results) + 128), (peak[0], _most_in_flight(out.results))
    t0 = out.started_at - offset                # the clock's start, on perf_counter
    lag = sorted(r.start_time - t0 - at for r, at in zip(out.results, arrival_times(n, rate, 1.0, 1)))
    assert lag[0] > -0.005, lag[0]              # none leaves early
    # a sender that waited for a free thread or sent in turn would fall ever further behind (a 2000-request
    # phase ends 5 s in); a loaded CI machine stalls for a second now and then (p90 0.79 s seen), so the
    # bounds hold the typical request close and the tail within a stall, not the tail within 0.25 s
    assert lag[n // 2] < 0.05 and lag[int(n * 0.9)] < 2.0, (lag[n // 2], lag[int(n * 0.9)])


def test_an_infinite_rate_phase_still_starts_every_client_before_the_clock():
    def one_run():
        with FakeServer(0.05, 0.001) as srv:
            target = HttpTarget(srv.url, "openai", flush_sleep_s=0.0, read_timeout_s=60.0)
            target.check()
            out = run_phase(target, Phase("P", flush_cache=False), random_lengths(60, 4, 4, 1000))
            target.close()
        starts = sorted(r.start_time for r in out.results)
        assert len(starts) == 60 and starts[-1] - starts[0] < 0.1      # all sent together, none waits for a thread

    in_one_of_three_runs(one_run)       # a stall of the machine while they are sent spreads one run's sends


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_an_open_loop_phase_of_more_requests_than_open_files_runs_with_a_warning(tmp_path):
    prof = tmp_path / "p.toml"
    prof.write_text('name = "p"\nseed = 1\n[dataset]\nkind = "random"\ninput_len = 16\noutput_len = 4\n'
                    'num_requests = 150\n[[phases]]\nname = "M"\nrequest_rate = 100\n')
    with FakeServer(0.01, 0.001) as srv:
        r = _bench(srv, tmp_path, nofile=(80, 80), profile=str(prof))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["phases"][0]["completed"] == 150
    warning = (f"warning: phase M sends 150 requests at 100 req/s with no max_concurrency, and salactl may open "
               f"only 80 files (RLIMIT_NOFILE): should more than {80 - OWN_FILES} be in flight at once, those past "
               f"it fail; give the phase a max_concurrency of at most {80 - OWN_FILES} or run `ulimit -n "
               f"{150 + OWN_FILES}` first to rule that out\n")
    assert warning in r.stderr, r.stderr
