"""Review 56 of bench: the summary shows a server's error text and skip reasons as text (not HTML),
a rate grid with one finite rate takes burstiness, and a record never names a CSV that is not there."""

import json
import os

import pytest

from bench_server import FakeServer
from salactl.bench.job import BenchSettings, run_bench
from salactl.bench.profiles import load_profile
from salactl.bench.summary import markdown_summary
from salactl.errors import EndpointError

pytestmark = pytest.mark.usefixtures("quick_thread_switches")

SCRIPT = "<script>alert(1)</script>"
TWO_PHASES = ('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 3\nnum_requests = 2\n'
              '[[phases]]\nname = "A"\nmax_concurrency = 1\nwarmup_requests = 0\nflush_cache = false\n'
              '[[phases]]\nname = "B"\nmax_concurrency = 1\nwarmup_requests = 0\nflush_cache = false\n')


def _write(tmp_path, body: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(body)
    return str(path)


# ---------------------------------------------------------------- server text shown as text
def test_a_servers_html_error_body_is_text_in_the_stopped_line(tmp_path):
    out = tmp_path / "o"
    with FakeServer(0.001, 0.0) as srv:
        srv.reject = lambda nth, body: (500, {"error": SCRIPT}) if nth > 2 else None     # phase B fails
        with pytest.raises(EndpointError):
            run_bench(BenchSettings(profile=_write(tmp_path, TWO_PHASES), endpoint=srv.url, flush_sleep=0.0,
                                    out=out))
    (md,) = out.glob("*.md")
    stopped = next(line for line in md.read_text().splitlines() if line.startswith("- **stopped**"))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in stopped and "<script>" not in stopped, stopped


def test_a_skip_reason_and_phase_name_are_text_in_the_summary():
    run = {"run_id": "r", "profile": "p", "target": "http", "model": "m", "phases": [],
           "skipped_phases": [{"phase": "x<b>", "reason": f"batch 8 > {SCRIPT}"}]}
    md = markdown_summary(run)
    assert f"skipped x&lt;b&gt;: batch 8 &gt; &lt;script&gt;alert(1)&lt;/script&gt;" in md and "<" not in md


# ---------------------------------------------------------------- burstiness with a rate grid
def test_burstiness_loads_where_some_point_of_a_rate_grid_is_finite(tmp_path):
    path = _write(tmp_path, '[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 2\n'
                            '[[phases]]\nname = "G"\nrequest_rate = [4, "inf"]\nburstiness = 0.5\n')
    phases = load_profile(path).phases
    assert [(p.name, p.request_rate, p.burstiness) for p in phases] == [
        ("G-rate4", 4.0, 0.5), ("G-rateinf", float("inf"), 0.5)]


def test_burstiness_on_a_grid_of_only_infinite_rates_is_still_refused(tmp_path):
    path = _write(tmp_path, '[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 2\n'
                            '[[phases]]\nname = "G"\nrequest_rate = ["inf", 1e400]\nburstiness = 0.5\n')
    with pytest.raises(Exception, match=r"phases\[0\]\.burstiness is ignored by phase G-rateinf \(and every other "
                                        r"point of its grid\), whose request_rate is inf"):
        load_profile(path)


# ---------------------------------------------------------------- no record names a missing CSV
def test_each_record_names_a_csv_that_is_in_place_as_it_is_appended(tmp_path):
    """Phase B fails (all its requests): the run stops, and A's record, appended before that, names the
    CSV, which was written before the record (not only on the way out)."""
    out = tmp_path / "o"
    seen = []
    with FakeServer(0.001, 0.0) as srv:
        def reject(nth, body):
            if nth > 2:         # phase B: A's record is on disk by now
                (line,) = (out / "records.jsonl").read_text().splitlines()
                seen.append(os.path.exists(json.loads(line)["details_csv"]))
                return 500, {"error": "down"}
            return None
        srv.reject = reject
        with pytest.raises(EndpointError):
            run_bench(BenchSettings(profile=_write(tmp_path, TWO_PHASES), endpoint=srv.url, flush_sleep=0.0,
                                    details=True, out=out))
    assert seen and all(seen)
