"""A SOAR score only from phases that did the whole workload (no failed request, no short answer),
an all-failed phase as an endpoint error, and --seed / --accuracy handling (real loopback server)."""

import json

import pytest

from bench_server import FakeServer
from bench_tokenizer import make_tokenizer
from salactl.bench.job import BenchSettings, run_bench
from salactl.errors import EndpointError, UsageError

SCORED = ('[dataset]\nkind = "random"\ninput_len = 4\noutput_len = 6\nnum_requests = 3\n'
          '[scoring]\nmethod = "soar"\nweights = { A = 0.5, B = 0.5 }\n'
          '[[phases]]\nname = "A"\nmax_concurrency = 1\n[[phases]]\nname = "B"\nmax_concurrency = 3\n')


pytestmark = pytest.mark.usefixtures("quick_thread_switches")


def _scored(tmp_path, srv, **kw):
    prof = tmp_path / "scored.toml"
    prof.write_text(SCORED)
    return run_bench(BenchSettings(profile=str(prof), endpoint=srv.url, flush_sleep=0.0, reference="A=1,B=1",
                                   out=tmp_path / "o", **kw)).to_dict()


def test_a_phase_with_a_failed_request_gets_no_score(tmp_path, capfd):
    with FakeServer(0.01, 0.001) as srv:
        # request 1 is A's warmup; request 2 is A's first timed request
        srv.reject = lambda nth, body: (400, {"error": "too long"}) if nth == 2 else None
        run = _scored(tmp_path, srv)
    a, b = run["phases"]
    assert a["failed"] == 1 and a["score_tier"] is None and a["score_error"] == "1 of 3 requests failed"
    assert b["failed"] == 0 and b["score_tier"] > 0 and b["score_error"] is None
    assert run["score"] is None and run["score_error"] == "A: 1 of 3 requests failed"
    assert json.loads((tmp_path / "o" / f"{run['run_id']}.json").read_text())["score_error"] == run["score_error"]
    assert "SOAR score: not computed (A: 1 of 3 requests failed)" in (tmp_path / "o" / f"{run['run_id']}.md").read_text()
    err = capfd.readouterr().err
    assert "warning: SOAR score not computed: A: 1 of 3 requests failed\n" in err


def test_short_answers_are_counted_warned_and_block_the_score(tmp_path, capfd):
    with FakeServer(0.01, 0.001) as srv:
        srv.stop_after = lambda n: max(1, n // 2)        # the server ignores ignore_eos
        run = _scored(tmp_path, srv, backend="openai")
    assert [p["short_outputs"] for p in run["phases"]] == [3, 3]
    assert all(p["completed"] == 3 and p["failed"] == 0 and p["score_tier"] is None for p in run["phases"])
    assert run["score"] is None
    assert run["score_error"] == ("A: 3 of 3 requests returned fewer tokens than requested; "
                                  "B: 3 of 3 requests returned fewer tokens than requested")
    err = capfd.readouterr().err
    assert ("warning: phase A: 3 of 3 requests returned fewer tokens than requested (e.g. 3 of 6); the server "
            "ignored ignore_eos/max_tokens or hit its context limit") in err
    assert "warning: phase B: 3 of 3 requests returned fewer tokens" in err


def test_a_clean_run_is_still_scored(tmp_path, capfd):
    with FakeServer(0.01, 0.001) as srv:
        run = _scored(tmp_path, srv)
    assert run["score"] > 0 and run["score_error"] is None
    assert all(p["short_outputs"] == 0 and p["output_len_estimated"] == 0 for p in run["phases"])
    assert "warning" not in capfd.readouterr().err


def test_an_all_failed_phase_writes_nothing_and_stops_with_an_endpoint_error(tmp_path):
    """It measured nothing: no record that `report latency` would show as a 0 tok/s row."""
    with FakeServer(0.01, 0.001) as srv:
        srv.reject = lambda nth, body: (400, {"error": "too long"}) if nth > 1 else None
        with pytest.raises(EndpointError, match=r"phase A: all 3 requests failed \(3x: HTTP 400 Bad Request"):
            _scored(tmp_path, srv)
        assert len(srv.requests) == 4                   # phase B never started
    assert not (tmp_path / "o" / "records.jsonl").exists() and not list((tmp_path / "o").glob("*.json"))


def _soar_rows(tmp_path, n=8):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"the quick brown fox {i}", "model_response": "lazy dog " * 3})
                            + "\n" for i in range(n)))
    return str(data)


def _order(tmp_path, seed, name):
    with FakeServer(0.001, 0.0) as srv:
        run = run_bench(BenchSettings(profile="soar", phases=("S1",), dataset=_soar_rows(tmp_path),
                                      endpoint=srv.url, tokenizer=str(make_tokenizer(tmp_path / "tok")),
                                      flush_sleep=0.0, seed=seed, out=tmp_path / name)).to_dict()
    return [q["body"]["text"] for q in srv.requests[1:]], run["phases"][0]["knobs"]


def test_seed_shuffles_the_dataset_and_is_recorded(tmp_path):
    default, k_default = _order(tmp_path, None, "a")
    one, _ = _order(tmp_path, 1, "b")
    seven, k_seven = _order(tmp_path, 7, "c")
    assert default == one                                # the profile's seed (1) stays the default
    assert sorted(seven) == sorted(default) and seven != default
    assert k_default["seed"] is None and k_default["dataset"]["seed"] == 1
    assert k_seven["seed"] == 7 and k_seven["dataset"]["seed"] == 7


@pytest.mark.parametrize("extra", [{}, {"profile": "serving"}])
def test_accuracy_without_reference_is_a_usage_error(tmp_path, extra):
    with pytest.raises(UsageError, match="--accuracy needs --reference"):
        run_bench(BenchSettings(endpoint="http://127.0.0.1:9", accuracy=99.5, out=tmp_path / "o", **extra))
    assert not (tmp_path / "o").exists()
