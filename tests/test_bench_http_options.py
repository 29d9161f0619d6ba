"""`salactl bench --endpoint` options checked before any work, as a subprocess against a loopback
server: the open-files limit a phase's concurrency needs (raised as SGLang's bench_serving raises
it, else exit 11), --request-timeout and --flush-sleep past what sockets and sleeps take (exit 2),
--model naming a local non-SALA checkpoint (its config.json only sizes random prompt ids), and an
empty --model."""

import json
import sys

import pytest

from bench_server import FakeServer
from salactl.bench.open_files import OWN_FILES
from test_cli_bench import salactl

resource = pytest.importorskip("resource")      # no RLIMIT_NOFILE on Windows


def _profile(tmp_path, num_requests: int, concurrency: str) -> str:
    prof = tmp_path / "p.toml"
    prof.write_text(f'name = "p"\nseed = 1\n[dataset]\nkind = "random"\ninput_len = 16\noutput_len = 4\n'
                    f'num_requests = {num_requests}\n[[phases]]\nname = "M"\nmax_concurrency = {concurrency}\n')
    return str(prof)


def _bench(srv, tmp_path, *args, nofile: tuple[int, int] | None = None, profile: str | None = None):
    """`salactl bench --json` of `profile` (2 requests, one at a time) against `srv`, under
    RLIMIT_NOFILE (soft, hard) when given."""
    limit = None if nofile is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile))
    return salactl("bench", "--profile", profile or _profile(tmp_path, 2, "1"), "--endpoint", srv.url,
                   "--flush-sleep", "0", "--out", str(tmp_path / "o"), "--json", *args,
                   preexec_fn=limit, timeout=180)


def _generations(srv) -> list[dict]:
    return [q["body"] for q in srv.requests]


def _hard_limit_at_least(n: int) -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < n:
        pytest.skip(f"the hard RLIMIT_NOFILE ({hard}) is below {n}")
    return n


@pytest.mark.skipif(sys.platform != "linux", reason="counts descriptors as Linux does")
def test_a_low_soft_open_files_limit_is_raised_so_no_request_fails_client_side(tmp_path):
    hard = _hard_limit_at_least(1024)
    with FakeServer(0.8, 0.01) as srv:              # every request holds its connection for ~0.8 s
        r = _bench(srv, tmp_path, nofile=(80, hard), profile=_profile(tmp_path, 150, '"unlimited"'))
    assert r.returncode == 0, r.stderr
    phase = json.loads(r.stdout)["phases"][0]
    assert phase["completed"] == 150 and phase["failed"] == 0, r.stderr
    assert "Too many open files" not in r.stderr


def test_a_phase_past_the_hard_open_files_limit_is_refused_before_any_request(tmp_path):
    with FakeServer(0.01, 0.001) as srv:
        r = _bench(srv, tmp_path, nofile=(80, 80), profile=_profile(tmp_path, 150, '"unlimited"'))
        assert _generations(srv) == []
    assert r.returncode == 11 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: phase M holds up to 150 requests in flight")
    assert f"needs {150 + OWN_FILES} open files" in r.stderr and "may open only 80 (RLIMIT_NOFILE" in r.stderr
    assert f"`ulimit -n {150 + OWN_FILES}`" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_phase_within_a_low_hard_limit_still_runs(tmp_path):
    with FakeServer(0.01, 0.001) as srv:
        r = _bench(srv, tmp_path, nofile=(80, 80), profile=_profile(tmp_path, 30, str(80 - OWN_FILES)))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["phases"][0]["completed"] == 30


@pytest.mark.parametrize("flag, value, message", [
    ("--request-timeout", "1e10", "--request-timeout must be at most 604800 s (a week; 0: no limit), got 1e+10"),
    ("--request-timeout", "604801", "--request-timeout must be at most 604800 s (a week; 0: no limit), got 604801"),
    ("--request-timeout", "inf", "--request-timeout must be a number of seconds >= 0, got inf"),
    ("--flush-sleep", "1e10", "--flush-sleep must be at most 3600 s (an hour), got 1e+10"),
    ("--flush-sleep", "-inf", "--flush-sleep must be a number of seconds >= 0, got -inf"),
])
def test_seconds_past_their_bound_are_usage_errors_before_any_request(tmp_path, flag, value, message):
    with FakeServer(0.01, 0.001) as srv:
        r = _bench(srv, tmp_path, flag, value)
        assert srv.requests == [] and srv.flushes == 0
    assert r.returncode == 2 and r.stderr == f"error: {message}\n", r.stderr
    assert not (tmp_path / "o").exists()


def test_the_longest_request_timeout_still_runs(tmp_path):
    with FakeServer(0.01, 0.001) as srv:
        r = _bench(srv, tmp_path, "--request-timeout", "604800")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["phases"][0]["completed"] == 2
    assert run["phases"][0]["knobs"]["target"]["request_timeout_s"] == 604800


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_model_naming_a_local_llama_checkpoint_takes_its_vocab_size(tmp_path, backend):
    model = tmp_path / "Llama-3-8B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                   "vocab_size": 128256, "hidden_size": 4096}))
    with FakeServer(0.01, 0.001) as srv:
        r = _bench(srv, tmp_path, "--model", str(model), "--backend", backend)
        ids = [i for b in _generations(srv) for i in (b["input_ids"] if backend == "sglang" else b["prompt"])]
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["model"] == str(model) and run["phases"][0]["knobs"]["dataset"]["vocab_size"] == 128256
    assert max(ids) < 128256 and max(ids) >= 1000         # not the 1000 ids of an unknown vocabulary


@pytest.mark.parametrize("config", ['{"model_type": "llama"}', '{"vocab_size": 0}', '{"vocab_size": "32000"}',
                                    '{"vocab_size": true}', "[32000]", "{not json", b"\xff\xfe"])
def test_a_config_without_a_usable_vocab_size_falls_back_to_1000_ids(tmp_path, config):
    model = tmp_path / "m"
    model.mkdir()
    path = model / "config.json"
    path.write_bytes(config) if isinstance(config, bytes) else path.write_text(config)
    with FakeServer(0.01, 0.001) as srv:
        r = _bench(srv, tmp_path, "--model", str(model))
        ids = [i for b in _generations(srv) for i in b["input_ids"]]
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["phases"][0]["knobs"]["dataset"]["vocab_size"] == 1000 and max(ids) < 1000


@pytest.mark.parametrize("model", ["", "  "])
def test_an_empty_model_with_an_endpoint_is_a_usage_error(tmp_path, model):
    with FakeServer(0.01, 0.001) as srv:
        r = _bench(srv, tmp_path, "--model", model)
        assert srv.requests == []
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: --model is empty; give the served model name")
    assert not (tmp_path / "o").exists()
