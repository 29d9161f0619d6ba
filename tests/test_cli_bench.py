"""`salactl bench` end to end as a subprocess: the embedded model on CPU at tiny scale, a SOAR
JSONL against a loopback server, strict dataset errors, Ctrl-C, and an unreachable endpoint."""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench_server import FakeServer
from bench_tokenizer import make_tokenizer
from conftest import run_cli
from salactl.runtime.tokenizer import Tokenizer

SGLANG_FIELDS = ("phase", "max_concurrency", "duration", "completed", "failed", "request_throughput",
                 "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                 "median_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms")


def salactl(*args, timeout=300, env=None, **kw):
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


def test_embedded_soar_end_to_end(tmp_path):
    out = tmp_path / "runs"
    r = salactl("bench", "--profile", "soar", "--model", "sala-nano", "--random-weights", "--device", "cpu",
                "--dtype", "float32", "--scale", "0.0005", "--num-requests", "2", "--details",
                "--reference", "S1=10,S8=10,Smax=10", "--accuracy", "99.5", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert [p["phase"] for p in run["phases"]] == ["S1", "S8", "Smax"]
    assert [p["max_concurrency"] for p in run["phases"]] == [1, 8, None]
    for p in run["phases"]:
        assert all(k in p for k in SGLANG_FIELDS)
        assert p["completed"] == 2 and p["failed"] == 0
        assert p["target"] == "embedded" and p["schema_version"] == 1 and p["kind"] == "bench"
        assert p["env"]["torch"] and p["knobs"]["target"]["chunk_size"] == 512
        t = p["knobs"]["target"]          # what really ran, named as `run` records name it
        assert t["weights"] == t["kv_cache_dtype"] == t["dtype"] == "float32"
    expect = sum(0.4 * 10 / p["duration"] * 100 if p["phase"] == "S1" else 0.3 * 10 / p["duration"] * 100
                 for p in run["phases"])
    assert run["score"] == pytest.approx(expect)
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert [x["phase"] for x in records] == ["S1", "S8", "Smax"]
    assert {x["run_id"] for x in records} == {run["run_id"]}
    rows = (out / f"{run['run_id']}-requests.csv").read_text().splitlines()
    assert rows[0].startswith("run_id,phase,request_id,input_len") and len(rows) == 1 + 6
    # ignore_eos + fixed lengths: every request produced exactly the tokens it asked for
    import csv
    per_phase = {}
    for row in csv.DictReader(rows):
        assert row["output_len"] == row["expected_output_len"] and row["success"] == "1"
        assert len(json.loads(row["itl_ms"])) == int(row["output_len"]) - 1
        per_phase[row["phase"]] = per_phase.get(row["phase"], 0) + int(row["output_len"])
    assert per_phase == {p["phase"]: p["total_output_tokens"] for p in run["phases"]}
    md = (out / f"{run['run_id']}.md").read_text()
    assert "| S1 |" in md and "SOAR score" in md
    import importlib.util
    if importlib.util.find_spec("matplotlib"):         # the `plots` extra
        names = sorted(Path(p).name.split("-", 2)[-1] for p in run["files"]["plots"])
        assert names == ["latency-cdf.png", "throughput.png", "ttft-vs-input.png"]
        assert all(Path(p).stat().st_size > 1000 and Path(p).name in md for p in run["files"]["plots"])
    else:
        assert run["files"]["plots"] == []


def test_soar_jsonl_against_server(tmp_path):
    tokdir = make_tokenizer(tmp_path / "tok")
    tok = Tokenizer(tokdir)
    rows = [{"question": f"the quick brown fox {i}", "model_response": "jumps over the lazy dog " * (i + 1)}
            for i in range(3)]
    data = tmp_path / "speed.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in rows))
    with FakeServer(0.01, 0.001) as srv:
        r = salactl("bench", "--profile", "soar", "--dataset", str(data), "--endpoint", srv.url,
                    "--backend", "sglang", "--tokenizer", str(tokdir), "--flush-sleep", "0",
                    "--out", str(tmp_path / "o"), "--json", "--phases", "S1,Smax")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["target"] == "sglang" and run["model"] == "fake-model"
    assert [p["phase"] for p in run["phases"]] == ["S1", "Smax"]
    assert all(p["completed"] == 3 for p in run["phases"])
    timed = [q["body"] for q in srv.requests if q["body"]["sampling_params"]["max_new_tokens"] > 0]
    want = sorted(len(tok.encode(x["model_response"])) for x in rows)
    # per phase: one warmup (capped at 32) + the 3 rows with their response token counts
    assert sorted(b["sampling_params"]["max_new_tokens"] for b in timed[1:4]) == want
    assert {b["text"] for b in timed} <= {x["question"] for x in rows}
    assert srv.flushes == 2


def test_malformed_row_reports_line_and_writes_nothing(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "a b c", "model_response": "d e f"}\n\n{"question": "x"}\n')
    out = tmp_path / "o"
    r = salactl("bench", "--dataset", str(data), "--endpoint", "http://127.0.0.1:9", "--out", str(out))
    assert r.returncode == 7
    assert r.stderr.strip().count("\n") == 0
    assert "bad.jsonl:3:" in r.stderr and "model_response" in r.stderr and "--skip-bad-rows" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize("flag,value,message", [
    ("--scale", "nan", "--scale must be a positive number, got nan"),
    ("--scale", "inf", "--scale must be a positive number, got inf"),
    ("--chunk-size", "0", "--chunk-size must be a positive token count, got 0"),
    ("--max-running-requests", "0", "--max-running-requests must be positive, got 0"),
    ("--request-timeout", "-1", "--request-timeout must be a number of seconds >= 0, got -1.0"),
    ("--flush-sleep", "nan", "--flush-sleep must be a number of seconds >= 0, got nan"),
    ("--mem-fraction", "0", "mem_fraction (--mem-fraction) must be in (0, 1] (a share of the free GPU memory), got 0.0"),
    ("--mem-fraction", "1.5", "mem_fraction (--mem-fraction) must be in (0, 1] (a share of the free GPU memory), got 1.5"),
])
def test_bad_numbers_are_one_line_usage_errors_before_any_work(tmp_path, flag, value, message):
    out = tmp_path / "o"
    r = salactl("bench", flag, value, "--endpoint", "http://127.0.0.1:9", "--out", str(out), timeout=60)
    assert r.returncode == 2 and message in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--endpoint", "http://127.0.0.1:9", "--kv-cache-dtype", "fp8_e4m3", "--engine", "gpu"],
     "--engine, --kv-cache-dtype configure the embedded runtime, not a server"),
    (["--endpoint", "http://127.0.0.1:9", "--random-weights"], "--random-weights configures the embedded runtime, not a server: set it on"),
    (["--endpoint", "http://127.0.0.1:9", "--mem-fraction", "0.5"], "--mem-fraction configures the embedded runtime"),
    (["--request-timeout", "5"], "--request-timeout applies to --endpoint servers only; drop it"),
    # given at their default values, they are refused all the same
    (["--endpoint", "http://127.0.0.1:9", "--kv-cache-dtype", "bf16"],
     "--kv-cache-dtype configures the embedded runtime, not a server: set it on the server's own command line; "
     "drop it, or drop --endpoint"),
    (["--endpoint", "http://127.0.0.1:9", "--engine", "auto", "--dtype", "auto"],
     "--dtype, --engine configure the embedded runtime, not a server: set them on"),
    (["--flush-sleep", "1", "--request-timeout", "21600"],
     "--flush-sleep, --request-timeout apply to --endpoint servers only; drop them for the embedded runtime"),
])
def test_options_of_the_other_target_are_usage_errors(tmp_path, args, message):
    out = tmp_path / "o"
    r = salactl("bench", *args, "--out", str(out), timeout=60)
    assert r.returncode == 2 and message in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert not out.exists()


def test_skipped_rows_are_reported_on_stderr(tmp_path):
    from salactl.bench.plan import read_datasets
    from salactl.bench.profiles import load_profile

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "a b c", "model_response": "d e f"}\nnot json\n{"question": 1}\n')
    phases = list(load_profile("soar").phases)
    r = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                        "from salactl.bench.plan import read_datasets; from salactl.bench.profiles import "
                        "load_profile; read_datasets({None: Path(sys.argv[1])}, "
                        "list(load_profile('soar').phases), True)", str(data)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"warning: skipped 2 malformed rows of {data} (lines 2, 3)" in r.stderr, r.stderr
    with pytest.raises(Exception, match="d.jsonl:2"):
        read_datasets({None: data}, phases, False)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_endpoint_fails_fast(tmp_path, capsys):
    out = tmp_path / "o"
    args = ["bench", "--endpoint", f"http://127.0.0.1:{_free_port()}", "--backend", "openai", "--out", str(out)]
    r = salactl(*args, timeout=120)
    assert r.returncode == 8
    assert "cannot reach" in r.stderr and "connection refused" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert not out.exists()
    # timed in this process: a subprocess's start-up alone took 12 s on a loaded 2-core machine
    t = time.perf_counter()
    code, _, err = run_cli(args, capsys)
    assert code == 8 and "connection refused" in err and not out.exists(), err
    assert time.perf_counter() - t < 10         # not the side requests' 30 s wait


def test_ctrl_c_keeps_finished_phases(tmp_path):
    prof = tmp_path / "two.toml"
    prof.write_text('[dataset]\nkind = "random"\ninput_len = 4\n'
                    '[[phases]]\nname = "quick"\nnum_requests = 2\noutput_len = 3\n'
                    '[[phases]]\nname = "slow"\nnum_requests = 4\noutput_len = 400\nwarmup_requests = 0\n')
    out = tmp_path / "o"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with FakeServer(0.01, 0.02) as srv:
        proc = subprocess.Popen([sys.executable, "-m", "salactl", "bench", "--profile", str(prof),
                                 "--endpoint", srv.url, "--flush-sleep", "0", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        records = out / "records.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (records.exists() and records.read_text().count("\n") >= 1):
            time.sleep(0.05)
        time.sleep(0.3)                                   # the slow phase is in flight now
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    lines = records.read_text().splitlines()
    assert [json.loads(x)["phase"] for x in lines] == ["quick"]
    summary = json.loads(next(out.glob("*.json")).read_text())
    assert summary["interrupted"] is True and [p["phase"] for p in summary["phases"]] == ["quick"]
    assert "interrupted" in next(out.glob("*.md")).read_text()


def test_embedded_one_batch_skips_batches_it_cannot_run(tmp_path):
    from salactl.bench.job import BenchSettings, run_bench

    run = run_bench(BenchSettings(profile="decode", model="sala-nano", random_weights=True, device="cpu",
                                  dtype="float32", scale=0.01, engine="reference", out=tmp_path)).to_dict()
    assert [p["phase"] for p in run["phases"]] == ["decode-bs1"]
    p = run["phases"][0]
    assert p["completed"] == 1 and p["total_output_tokens"] == 3 and p["input_len"] == 10
    assert p["prefill_latency"] > 0 and p["median_decode_latency"] > 0
    assert p["knobs"]["target"]["engine"] == "reference"
    assert [s["phase"] for s in run["skipped_phases"]] == ["decode-bs8", "decode-bs32"]
    assert "one sequence at a time" in run["skipped_phases"][0]["reason"]


@pytest.mark.parametrize("args,message", [
    (["--mem-fraction", "0.5"], "--mem-fraction sizes the GPU engine; the reference engine serves one sequence"),
    (["--max-running-requests", "64"], "--max-running-requests sizes the GPU engine; the reference engine"),
    (["--max-running-requests", "4", "--mem-fraction", "0.9"],
     "--max-running-requests, --mem-fraction size the GPU engine; the reference engine serves one sequence "
     "at a time and grows its cache as it goes: drop them, or use --engine gpu on CUDA"),
    (["--skip-bad-rows"], "--skip-bad-rows drops malformed --dataset rows, and without --dataset the prompts are "
                          "synthetic: drop --skip-bad-rows, or add --dataset"),
    (["--profile", "decode", "--num-requests", "3"],
     "--num-requests does not apply to profile decode: each phase is one batch, whose batch size sets its "
     "request count (decode-bs1, decode-bs8, decode-bs32); drop --num-requests, and pick batch sizes with --phases"),
    (["--profile", "long-context", "--num-requests", "1"], "--num-requests does not apply to profile long-context"),
    (["--kv-cache-dtype", "fp16"], "--kv-cache-dtype 'fp16' is not supported; supported today: bf16, fp8_e5m2, "
                                   "fp8_e4m3 (also auto for bf16)"),
    (["--profile", "decode", "--scale", "0.002"],
     "--scale 0.002 scales the output of phase decode-bs1 from 256 to 1 token (2 more phases too), too few for its "
     "TPOT and ITL (2 or more): use --scale 0.00586 or more"),
    (["--profile", "serving", "--scale", "0.002", "--phases", "serving-rate4"],
     "--scale 0.002 scales the output of phase serving-rate4 from 128 to 1 token, too few for its TPOT and ITL "
     "(2 or more): use --scale 0.0118 or more"),
])
def test_options_the_embedded_run_would_ignore_are_usage_errors(tmp_path, args, message):
    """Given explicitly, even at their default values, they are refused before the model loads."""
    out = tmp_path / "o"
    r = salactl("bench", "--scale", "0.01", "--engine", "reference", "--device", "cpu", *args, "--out", str(out),
                timeout=60)
    assert r.returncode == 2 and message in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert not out.exists()


def test_scale_is_refused_with_a_dataset(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "a b c", "model_response": "d e f"}\n')
    r = salactl("bench", "--dataset", str(data), "--scale", "1", "--phases", "S1", "--device", "cpu",
                "--out", str(tmp_path / "o"), timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--scale scales the lengths of synthetic prompts; --dataset rows keep their own lengths" in r.stderr


def test_default_scale_and_engine_sizes_when_not_given():
    from salactl.bench.engine_options import gpu_engine_sizes
    from salactl.bench.plan import plan_phases
    from salactl.bench.profiles import load_profile

    profile = load_profile("decode")
    (plan,) = plan_phases(profile, profile.phases[:1], {}, {}, None, 100, None, None)
    assert plan.dataset["scale"] == 1.0 and plan.dataset["input_len"] == 1024
    assert gpu_engine_sizes(None, None) == (64, 0.9) and gpu_engine_sizes(8, 0.5) == (8, 0.5)


def test_the_reference_engine_records_no_gpu_engine_sizes(tmp_path):
    from salactl.bench.job import BenchSettings, run_bench

    run = run_bench(BenchSettings(profile="decode", model="sala-nano", random_weights=True, device="cpu",
                                  dtype="float32", scale=0.01, engine="reference", phases=("decode-bs1",),
                                  out=tmp_path)).to_dict()
    target = run["phases"][0]["knobs"]["target"]
    assert target["mem_fraction"] is None and target["max_running_requests"] == 1


def _gpu_engine_available() -> bool:
    try:
        from salactl.runtime.gpu.available import gpu_engine_available
        return gpu_engine_available("cuda")
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_engine_available(), reason="needs CUDA, Triton and the GPU engine")
def test_embedded_gpu_engine_batches_requests(tmp_path):
    # a small --mem-fraction: the default 0.9 of the free memory starves the GPU suite's other shards
    r = salactl("bench", "--profile", "soar", "--model", "sala-nano", "--random-weights", "--device", "cuda",
                "--engine", "gpu", "--scale", "0.002", "--num-requests", "8", "--phases", "S8,Smax",
                "--mem-fraction", "0.05", "--out", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    for p in run["phases"]:
        assert p["completed"] == 8 and p["failed"] == 0
        assert p["knobs"]["target"]["engine"] == "gpu" and p["knobs"]["target"]["chunk_size"] == 8192
        assert p["knobs"]["target"]["mem_fraction"] == 0.05
        assert p["peak_gpu_memory_bytes"] > 0
        assert p["max_concurrent_requests"] > 1
        if importlib.util.find_spec("pynvml"):            # NVML energy counter (Volta and newer)
            assert p["energy_j"] > 0 and p["mean_power_w"] > 0 and p["energy_per_output_token_j"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_engine_available(), reason="needs CUDA, Triton and the GPU engine")
def test_embedded_gpu_engine_sizes_its_caches_by_mem_fraction(tmp_path):
    """The caches take --mem-fraction of the free GPU memory: a sliver of it cannot hold even one
    request of the 9B, which fails the run with the capacity error (exit 11) before any request."""
    r = salactl("bench", "--profile", "soar", "--model", "sala-9b", "--random-weights", "--device", "cuda",
                "--engine", "gpu", "--scale", "0.002", "--num-requests", "2", "--phases", "S1",
                "--mem-fraction", "0.0001", "--out", str(tmp_path / "o"))
    assert r.returncode == 11, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "--mem-fraction 0.0001" in r.stderr, r.stderr


def test_accuracy_without_reference_is_a_one_line_usage_error(tmp_path):
    out = tmp_path / "o"
    r = salactl("bench", "--accuracy", "99.5", "--endpoint", "http://127.0.0.1:9", "--out", str(out), timeout=60)
    assert r.returncode == 2 and "--accuracy needs --reference" in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and not out.exists()


def _random_profile(tmp_path) -> str:
    prof = tmp_path / "p.toml"
    prof.write_text('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 4\nnum_requests = 3\n'
                    '[[phases]]\nname = "A"\n[[phases]]\nname = "B"\n')
    return str(prof)


def _bench_rejecting(tmp_path, reject, *args):
    """`salactl bench` of the two-phase random profile against a server that answers `reject`."""
    with FakeServer(0.01, 0.001) as srv:
        srv.reject = reject
        return salactl("bench", "--profile", _random_profile(tmp_path), "--endpoint", srv.url, "--flush-sleep",
                       "0", "--out", str(tmp_path / "o"), *args)


def test_an_all_failed_first_phase_exits_8_and_writes_nothing(tmp_path):
    out = tmp_path / "o"
    r = _bench_rejecting(tmp_path, lambda nth, body: (400, {"error": "prompt too long"}) if nth > 1 else None)
    assert r.returncode == 8, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: phase A: all 3 requests failed (3x: HTTP 400 Bad Request"), r.stderr
    assert "prompt too long" in last and last.endswith("; no phase finished, so nothing was written")
    assert "warning" not in r.stderr and not out.exists()


def test_an_all_failed_later_phase_keeps_only_the_finished_ones(tmp_path):
    out = tmp_path / "o"
    # A: warmup + 3 requests; B: its warmup passes, then all 3 fail
    r = _bench_rejecting(tmp_path, lambda nth, body: (500, {"error": "late"}) if nth > 5 else None)
    assert r.returncode == 8, r.stderr
    run_id = next(out.glob("*.json")).stem
    assert r.stderr.strip().splitlines()[-1].endswith(
        f"; the finished phases (A) are in {out / 'records.jsonl'} and {out / run_id}.md/.json")
    assert [json.loads(x)["phase"] for x in (out / "records.jsonl").read_text().splitlines()] == ["A"]
    assert [p["phase"] for p in json.loads((out / f"{run_id}.json").read_text())["phases"]] == ["A"]


def test_partial_failures_exit_0_and_lead_the_summary(tmp_path):
    out = tmp_path / "o"
    r = _bench_rejecting(tmp_path, lambda nth, body: (500, {"error": "odd"}) if nth in (2, 3) else None, "--phases", "A")
    assert r.returncode == 0, r.stderr
    assert "2 of 3 requests failed in phase A (left out of its statistics; the exit status stays 0" in r.stdout
    assert "- **2 of 3 requests failed** in phase A" in next(out.glob("*.md")).read_text()


@pytest.mark.parametrize("key", ["sk-abc\n", "sk-\u00e9\u0100"])
def test_a_bad_api_key_is_a_one_line_usage_error(tmp_path, key):
    out = tmp_path / "o"
    with FakeServer(0.01, 0.001) as srv:
        r = salactl("bench", "--endpoint", srv.url, "--backend", "openai", "--out", str(out), timeout=60,
                    env=dict(os.environ, OPENAI_API_KEY=key))
        assert srv.requests == [] and srv.side_posts == []
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: OPENAI_API_KEY contains") and r.stderr.strip().count("\n") == 0
    assert not out.exists()


def test_seed_and_the_request_timeout_default_reach_the_records(tmp_path):
    with FakeServer(0.01, 0.001) as srv:
        r = salactl("bench", "--profile", _random_profile(tmp_path), "--endpoint", srv.url, "--flush-sleep", "0",
                    "--seed", "7", "--out", str(tmp_path / "o"), "--json")
    assert r.returncode == 0, r.stderr
    knobs = json.loads(r.stdout)["phases"][0]["knobs"]
    assert knobs["seed"] == 7 and knobs["dataset"]["seed"] == 7
    assert knobs["input_len"] == knobs["dataset"]["input_len"] > 0
    assert knobs["output_len"] == knobs["dataset"]["output_len"] > 0
    assert knobs["target"]["request_timeout_s"] == 21600


def test_kv_cache_dtype_auto_stores_the_models_dtype_and_out_has_a_short_flag(tmp_path):
    """bench takes run's KV names ("auto" = "bf16": the model's dtype), records the stored dtype as run
    does, and -o is --out."""
    out = tmp_path / "o"
    r = salactl("bench", "--profile", "decode", "--phases", "decode-bs1", "--scale", "0.01", "--engine", "reference",
                "--device", "cpu", "--dtype", "float32", "--kv-cache-dtype", "auto", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    (phase,) = json.loads(r.stdout)["phases"]
    assert phase["knobs"]["target"]["kv_cache_dtype"] == "float32" and phase["completed"] == 1
    assert (out / "records.jsonl").is_file()


def test_vllm_backend_speaks_the_openai_protocol_and_records_both(tmp_path):
    with FakeServer(0.01, 0.001) as srv:
        r = salactl("bench", "--profile", _random_profile(tmp_path), "--phases", "A", "--endpoint", srv.url,
                    "--backend", "vllm", "--flush-sleep", "0", "--out", str(tmp_path / "o"), "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["target"] == "vllm" and run["model"] == "fake-model"      # listed by /v1/models
    (phase,) = run["phases"]
    assert phase["completed"] == 3 and phase["failed"] == 0
    assert {k: phase["knobs"]["target"][k] for k in ("backend", "protocol")} == {"backend": "vllm", "protocol": "openai"}
    assert {q["path"] for q in srv.requests} == {"/v1/completions"} and srv.side_posts == ["/reset_prefix_cache"]
    assert "vllm" in salactl("bench", "--help", env=dict(os.environ, COLUMNS="200")).stdout


def test_the_soar_mix_keeps_two_output_tokens_at_any_scale():
    """The README's `bench --profile soar --scale 0.002` is not refused: the synthetic SOAR mix gives
    every request 2 tokens or more; a one-token prefill profile measures no decode and passes too."""
    from salactl.bench.plan import check_decode_lengths, plan_phases, smallest_scale
    from salactl.bench.profiles import load_profile

    soar = load_profile("soar")
    check_decode_lengths(soar, list(soar.phases), 0.002)
    plans = plan_phases(soar, list(soar.phases), {}, {}, None, 1000, 0.002, None)
    assert min(r.output_len for p in plans for r in p.requests) == 2
    prefill = load_profile("prefill")
    check_decode_lengths(prefill, list(prefill.phases), 0.002)
    for length in (2, 3, 7, 32, 128, 256, 4096):
        least = smallest_scale(length, 2)
        assert round(length * least) >= 2 > round(length * least * 0.99), (length, least)
