"""Review 55 of bench: non-finite score inputs refused and an overflowing score still rendered; the
run's side files written all or none; burstiness only where it acts; repeated --reference/--slo
names; the warmup's 32-token cap and the flush sleep before the clock (real loopback server)."""

import json
import math
import os
import re
import subprocess
import sys

import pytest

from bench_server import FakeServer
from bench_tokenizer import make_tokenizer
from salactl.bench.job import BenchSettings, run_bench
from salactl.bench.metrics import parse_slo
from salactl.bench.profiles import load_profile
from salactl.bench.scoring import parse_reference, soar_score
from salactl.errors import ConfigError, OutputWriteError, UsageError
from salactl.runtime.tokenizer import Tokenizer

from test_output_write_failures import error_line, salactl_with_file_limit

pytestmark = pytest.mark.usefixtures("quick_thread_switches")

SCORED = ('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 3\nnum_requests = 2\n'
          '[scoring]\nmethod = "soar"\nweights = {{ A = {weight} }}\n'
          '[[phases]]\nname = "A"\nmax_concurrency = 1\nwarmup_requests = 0\nflush_cache = false\n')


def _write(tmp_path, body: str, name: str = "p.toml") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONUNBUFFERED="1"))


# ---------------------------------------------------------------- non-finite score inputs, huge scores
def test_an_infinite_scoring_weight_is_a_one_line_config_error_before_any_output(tmp_path):
    path = _write(tmp_path, SCORED.format(weight="inf"))
    with pytest.raises(ConfigError, match=r"p.toml: scoring.weights.A must be a positive finite number, got inf"):
        load_profile(path)
    r = salactl("bench", "--profile", path, "--reference", "A=1", "--endpoint", "http://127.0.0.1:9",
                "--out", tmp_path / "o")
    assert r.returncode == ConfigError.exit_code == 3, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o").exists()


def test_a_score_past_the_float_range_is_rendered_not_a_crash(tmp_path):
    """1.7e308 s / a sub-second duration x 100 overflows to inf: the summaries say so, all of them."""
    with FakeServer(0.001, 0.0) as srv:
        run = run_bench(BenchSettings(profile=_write(tmp_path, SCORED.format(weight="1.0")), endpoint=srv.url,
                                      flush_sleep=0.0, reference="A=1.7e308", out=tmp_path / "o")).to_dict()
    assert run["score"] == "inf" and run["score_details"]["tier_scores"] == {"A": "inf"}
    out = tmp_path / "o"
    md = (out / f"{run['run_id']}.md").read_text()
    assert "- SOAR score inf = Σ w·ref/own·100 (A inf)\n" in md
    assert "follow SGLang bench_serving except where docs/reference.md (salactl bench) notes" in md
    assert json.loads((out / f"{run['run_id']}.json").read_text())["score"] == "inf"


def test_an_eliminated_run_scores_0_even_when_its_performance_overflows():
    d = soar_score({"A": 1e-3}, {"A": 1.7e308}, {"A": 1.0}, accuracy=50.0)
    assert math.isinf(d["performance"]) and d["accuracy_coefficient"] == 0.0 and d["score"] == 0.0


# ---------------------------------------------------------------- side files: all or none
def test_a_full_disk_while_writing_the_side_files_leaves_none_of_them(tmp_path):
    """The per-request CSV (~160 KB: 1000-token ITL lists) goes past a 48 KB file-size limit that the
    record and the throughput plot (~13 KB) fit under: no plot, CSV or summary is left, only the record,
    which names no CSV."""
    import matplotlib  # noqa: F401  (the [test] extra installs it; the plot written before the CSV is what was left behind)
    profile = _write(tmp_path, '[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 1000\nnum_requests = 16\n'
                               '[[phases]]\nname = "P"\nmax_concurrency = 4\nwarmup_requests = 0\n'
                               'flush_cache = false\n')
    out = tmp_path / "o"
    with FakeServer(0.0, 0.0) as srv:
        r = salactl_with_file_limit(48 * 1024, "bench", "--profile", profile, "--endpoint", srv.url,
                                    "--flush-sleep", "0", "--details", "--out", out)
    assert r.returncode == OutputWriteError.exit_code == 16, r.stderr
    line = error_line(r.stderr)
    assert line.startswith(f"error: cannot write {out}/") and line.endswith(
        "-requests.csv: File too large; the file reached a size limit of its file system or of this process "
        "(ulimit -f); choose another --out"), line
    assert sorted(os.listdir(out)) == ["records.jsonl"]         # nor a staging directory
    record = json.loads((out / "records.jsonl").read_text())
    assert record["phase"] == "P"
    # still appended, it names no CSV (not a path that does not exist) and says why
    assert record["details_csv"] is None and "-requests.csv: File too large" in record["details_error"]


# ---------------------------------------------------------------- burstiness only where it acts
@pytest.mark.parametrize("phase, where, message", [
    ("request_rate = 2\nburstiness = inf\n", "phases[0].burstiness", "must be a positive finite number, got inf"),
    ("burstiness = 0.5\n", "phases[0].burstiness",
     "is ignored by phase x, whose request_rate is inf (every request leaves at t=0); drop it, or set a "
     "finite request_rate"),
    ("request_rate = 1e400\nburstiness = 0.5\n", "phases[0].burstiness", "is ignored by phase x,"),
])
def test_burstiness_that_would_do_nothing_or_break_arrivals_is_refused(tmp_path, phase, where, message):
    path = _write(tmp_path, f'[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 2\n[[phases]]\nname = "x"\n{phase}')
    with pytest.raises(ConfigError, match=re.escape(f"p.toml: {where} {message}")):
        load_profile(path)


def test_burstiness_with_a_finite_rate_still_loads(tmp_path):
    path = _write(tmp_path, '[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 2\n'
                            '[[phases]]\nname = "x"\nrequest_rate = 2\nburstiness = 0.5\n')
    assert [(p.request_rate, p.burstiness) for p in load_profile(path).phases] == [(2.0, 0.5)]


def test_ignored_burstiness_is_exit_3_on_one_line(tmp_path):
    path = _write(tmp_path, '[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 2\n'
                            '[[phases]]\nname = "x"\nburstiness = 0.5\n')
    r = salactl("bench", "--profile", path, "--endpoint", "http://127.0.0.1:9", "--out", tmp_path / "o")
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "phases[0].burstiness is ignored by phase x" in r.stderr


# ---------------------------------------------------------------- repeated --reference / --slo names
def test_a_name_repeated_in_reference_or_slo_is_a_usage_error():
    with pytest.raises(UsageError, match=r"^--reference gives S1 twice \(400 and 500\); give each name once$"):
        parse_reference("S1=400,S8=600,S1=500")
    with pytest.raises(UsageError, match=r"^--slo gives ttft twice \(500 and 20\); give each name once$"):
        parse_slo("ttft=500, ttft=20")


def test_a_repeated_reference_name_is_exit_2_before_any_request(tmp_path):
    r = salactl("bench", "--reference", "S1=1,S8=1,Smax=1,S8=2", "--endpoint", "http://127.0.0.1:9",
                "--out", tmp_path / "o")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--reference gives S8 twice (1 and 2)" in r.stderr and not (tmp_path / "o").exists()


# ---------------------------------------------------------------- warmup cap, flush, sleep, clock
def test_the_warmup_is_capped_at_32_tokens_then_the_flush_and_its_sleep_precede_the_clock(tmp_path):
    tokdir = make_tokenizer(tmp_path / "tok")
    response = "jumps over the lazy dog " * 10
    full = len(Tokenizer(tokdir).encode(response))
    assert full >= 40
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "the quick brown fox", "model_response": response}) + "\n")
    with FakeServer(0.001, 0.0) as srv:
        run_bench(BenchSettings(profile="soar", phases=("S1",), dataset=str(data), endpoint=srv.url,
                                tokenizer=str(tokdir), flush_sleep=0.3, out=tmp_path / "o"))
    warmup, measured = (q["body"]["sampling_params"]["max_new_tokens"] for q in srv.requests)
    assert (warmup, measured) == (32, full)
    (t_warmup, p1), (t_flush, p2), (t_first, p3) = srv.post_log
    assert (p1, p2, p3) == ("/generate", "/flush_cache", "/generate")
    assert t_warmup < t_flush and t_first - t_flush >= 0.3
