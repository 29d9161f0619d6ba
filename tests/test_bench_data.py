"""Profiles (shipped and user files), SOAR JSONL strictness, synthetic length mixes."""

import json
import math

import pytest

from bench_tokenizer import make_tokenizer
from salactl.bench.datasets import read_soar_rows, soar_requests
from salactl.bench.profiles import load_profile, shipped_profiles
from salactl.bench.synthetic import (SOAR_INPUT_BINS, SOAR_OUTPUT_BINS, apportion, random_lengths,
                                     soar_like)
from salactl.errors import ConfigError, DatasetError
from salactl.runtime.tokenizer import Tokenizer


def test_shipped_profiles_load():
    assert {"soar", "decode", "prefill", "long-context", "serving"} <= set(shipped_profiles())
    soar = load_profile("soar")
    assert [(p.name, p.max_concurrency, p.num_requests) for p in soar.phases] == \
        [("S1", 1, 12), ("S8", 8, 36), ("Smax", None, 96)]
    assert all(p.warmup_requests == 1 and p.flush_cache and math.isinf(p.request_rate) for p in soar.phases)
    assert soar.scoring.weights == {"S1": 0.4, "S8": 0.3, "Smax": 0.3} and soar.seed == 1
    decode = load_profile("decode")
    assert decode.mode == "one-batch"
    assert [(p.name, p.batch_size, p.max_concurrency) for p in decode.phases] == \
        [("decode-bs1", 1, 1), ("decode-bs8", 8, 8), ("decode-bs32", 32, 32)]
    serving = load_profile("serving")
    assert [p.request_rate for p in serving.phases] == [1, 2, 4, 8, 16, math.inf]
    assert len(load_profile("prefill").phases) == 4 and len(load_profile("long-context").phases) == 4


def test_user_profile_file(tmp_path):
    p = tmp_path / "mine.toml"
    p.write_text('name = "mine"\n[dataset]\nkind = "random"\ninput_len = 8\noutput_len = 4\n'
                 '[[phases]]\nname = "x"\nmax_concurrency = [1, 4]\nrequest_rate = 2.5\nburstiness = 0.5\n')
    prof = load_profile(str(p))
    assert [(q.name, q.max_concurrency, q.request_rate, q.burstiness) for q in prof.phases] == \
        [("x-c1", 1, 2.5, 0.5), ("x-c4", 4, 2.5, 0.5)]


@pytest.mark.parametrize("body, message", [
    ('[[phases]]\nname = "a"\nmax_concurrency = 0\n', 'phases\\[0\\].max_concurrency must be a positive integer or "unlimited"'),
    ('[[phases]]\nname = "a"\nspeed = 3\n', "phases\\[0\\] has unknown key 'speed'"),
    ('[[phases]]\nname = "a"\n[[phases]]\nname = "a"\n', "two phases named 'a'"),
    ('[[phases]]\nname = "a"\nrequest_rate = "fast"\n', "request_rate must be a positive number"),
    ('phases = []\n', "phases must be a non-empty array"),
    ('[scoring]\nweights = {S9 = 1.0}\n[[phases]]\nname = "S1"\n', "scoring.weights.S9 names no phase"),
    ('mode = "one-batch"\n[[phases]]\nname = "a"\nbatch_size = 2\n', "needs input_len"),
    ('[[phases]]\nname = "a"\nbatch_size = 2\n', 'only valid with mode = "one-batch"'),
    ('[dataset]\nkind = "random"\n[[phases]]\nname = "a"\n', "needs input_len and output_len"),
    ('[[phases]\nname = "a"\n', "not valid TOML"),
])
def test_profile_errors_are_one_line(tmp_path, body, message):
    p = tmp_path / "bad.toml"
    p.write_text(body)
    with pytest.raises(ConfigError, match=message) as e:
        load_profile(str(p))
    assert "\n" not in str(e.value) and "bad.toml" in str(e.value)


def test_bare_names_prefer_shipped_profiles(tmp_path, monkeypatch):
    """An output directory named like a profile (soar_bench.sh makes `soar`) must not shadow it;
    a bare name that is no shipped profile still reads the file, and ./soar means the path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "soar").mkdir()
    (tmp_path / "mine").write_text('[[phases]]\nname = "only"\n')
    assert load_profile("soar").source == "soar" and len(load_profile("soar").phases) == 3
    assert [p.name for p in load_profile("mine").phases] == ["only"]
    with pytest.raises(ConfigError, match="is a directory"):
        load_profile("./soar")


def test_unknown_profile_lists_shipped():
    with pytest.raises(ConfigError, match="unknown profile 'nope'; shipped profiles: .*soar"):
        load_profile("nope")


def write_rows(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_soar_jsonl_strict_line_numbers(tmp_path):
    good = {"question": "the quick brown fox", "model_response": "jumps over the lazy dog"}
    f = write_rows(tmp_path / "d.jsonl", [good, "", '{"question": "x", "model_response": 3}', good])
    with pytest.raises(DatasetError, match=r"d.jsonl:3: row field 'model_response' must be a string.*--skip-bad-rows"):
        read_soar_rows(f)
    f2 = write_rows(tmp_path / "e.jsonl", [good, "{not json", good])
    with pytest.raises(DatasetError, match=r"e.jsonl:2: row is not valid JSON"):
        read_soar_rows(f2)
    f3 = write_rows(tmp_path / "g.jsonl", [{"model_response": "a"}])
    with pytest.raises(DatasetError, match=r"g.jsonl:1: row has no prompt field"):
        read_soar_rows(f3)
    rows, report = read_soar_rows(f2, skip_bad_rows=True)
    assert [r.line for r in rows] == [1, 3] and report.bad_lines == (2,)
    with pytest.raises(DatasetError, match="does not exist"):
        read_soar_rows(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="no usable rows"):
        read_soar_rows(write_rows(tmp_path / "h.jsonl", ["[1]"]), skip_bad_rows=True)


def test_soar_requests_token_counts_and_shuffle(tmp_path):
    tok = Tokenizer(make_tokenizer(tmp_path / "tok"))
    rows_src = [{"question": f"benchmark the server {i} " * (i + 1), "model_response": "short answers " * (i + 1)}
                for i in range(6)] + [{"input": "", "model_response": "the lazy dog"}]
    rows, _ = read_soar_rows(write_rows(tmp_path / "d.jsonl", rows_src))
    reqs, too_short = soar_requests(rows, tok, seed=1)
    assert too_short == 1 and len(reqs) == 6                 # the empty prompt is BOS only: dropped
    for r in reqs:
        src = rows_src[r.source_line - 1]
        assert r.output_len == len(tok.encode(src["model_response"]))
        assert list(r.prompt_ids) == tok.encode(src["question"]) and r.prompt_text == src["question"]
    assert [r.source_line for r in reqs] != sorted(r.source_line for r in reqs)   # shuffled
    again, _ = soar_requests(rows, tok, seed=1)
    assert [r.source_line for r in again] == [r.source_line for r in reqs]


def test_synthetic_soar_mix_follows_the_bins():
    assert apportion(12, [b[2] for b in SOAR_INPUT_BINS]) == [3, 2, 2, 4, 1]   # 3, 1.6, 1.6, 4.2, 1.6: ties go to earlier bins
    assert sum(apportion(96, [b[2] for b in SOAR_OUTPUT_BINS])) == 96
    reqs = soar_like(96, 1.0, vocab_size=73448, seed=1)
    ins = [r.input_len for r in reqs]
    assert sum(1 for x in ins if x <= 4096) == 24                     # 25%
    assert sum(1 for x in ins if 32768 < x <= 131072) == 33           # 33.6 -> 33 by largest remainder
    assert max(ins) <= 160 * 1024 and max(r.output_len for r in reqs) <= 32 * 1024
    assert sum(1 for r in reqs if r.output_len <= 512) == 33          # 33.6 -> 33
    assert all(len(r.prompt_ids) == r.input_len and min(r.prompt_ids) >= 100 for r in reqs)
    small = soar_like(96, 0.001, vocab_size=512, seed=1)
    assert max(r.input_len for r in small) <= 164 and min(r.input_len for r in small) >= 2
    assert [r.input_len for r in soar_like(8, 0.01, 512, seed=5)] == [r.input_len for r in soar_like(8, 0.01, 512, seed=5)]


def test_random_lengths_are_exact_by_default():
    reqs = random_lengths(5, 37, 9, vocab_size=512, seed=2)
    assert all(r.input_len == 37 == len(r.prompt_ids) and r.output_len == 9 for r in reqs)
    spread = random_lengths(200, 100, 10, vocab_size=512, range_ratio=0.5, seed=2)
    assert min(r.input_len for r in spread) >= 50 and max(r.input_len for r in spread) <= 150
    assert len({r.input_len for r in spread}) > 20


def test_dataset_spec_per_phase(tmp_path):
    from salactl.bench.plan import parse_dataset_spec, read_datasets, select_phases
    from salactl.errors import UsageError

    soar = load_profile("soar")
    names = [p.name for p in soar.phases]
    assert parse_dataset_spec("a.jsonl", names) == {None: tmp_path.__class__("a.jsonl")}
    spec = parse_dataset_spec(f"S1={tmp_path}/s1.jsonl,Smax={tmp_path}/x.jsonl", names)
    assert set(spec) == {"S1", "Smax"}
    with pytest.raises(UsageError, match="names phase 'S9'"):
        parse_dataset_spec("S1=a.jsonl,S9=b.jsonl", names)
    write_rows(tmp_path / "s1.jsonl", [{"question": "a b", "model_response": "c d"}])
    # only the selected phases need (and parse) a file
    parsed = read_datasets(spec, select_phases(soar, ["S1"]), False)
    assert list(parsed) == [tmp_path / "s1.jsonl"]
    with pytest.raises(UsageError, match="no file for phase S8"):
        read_datasets(spec, select_phases(soar, ["S1", "S8"]), False)
