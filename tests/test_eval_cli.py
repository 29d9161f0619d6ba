"""`salactl eval ppl|passkey` through the real console entry point on the shipped model (CPU)."""

import json
import random
import subprocess
import sys

from salactl.evaluation.passkey import extract_answer, make_passkey_prompt
from salactl.evaluation.perplexity import score_windows, scored_targets, unigram_baseline
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.tokenizer import Tokenizer


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True, timeout=300)


def test_eval_ppl_on_a_file_beats_the_unigram_baseline(tmp_path):
    text = tmp_path / "held.txt"
    text.write_text("import os\n\n\ndef join(a, b):\n    return os.path.join(a, b)\n" * 6)
    r = salactl("eval", "ppl", "--file", str(text), "--seq-len", "48", "--max-tokens", "80",
                "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["tokens"] == 80 and rec["windows"] == 2 and rec["file"] == str(text)
    assert rec["ppl"] < rec["unigram"]["ppl"]


def test_eval_ppl_builtin_split_and_table():
    r = salactl("eval", "ppl", "--max-tokens", "40", "--seq-len", "40", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "unigram baseline" in r.stdout and "perplexity" in r.stdout


def test_eval_passkey_json_and_errors():
    r = salactl("eval", "passkey", "--lengths", "128", "--depths", "0.5", "--trials", "1",
                "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    (row,) = rec["results"]
    assert row["length"] == 128 and row["depth"] == 0.5 and row["trials"] == 1
    assert row["correct"] in (0, 1) and rec["accuracy_by_length"]["128"] == row["accuracy"]
    bad = salactl("eval", "passkey", "--depths", "1.5", "--device", "cpu")
    assert bad.returncode == 2 and "--depths" in bad.stderr and "Traceback" not in bad.stderr
    short = salactl("eval", "passkey", "--lengths", "512,8", "--device", "cpu")
    assert short.returncode == 2 and "too short" in short.stderr
    assert len(short.stderr.strip().splitlines()) == 1, short.stderr   # no progress bar before the error
    missing = salactl("eval", "ppl", "--file", "/nonexistent.txt", "--device", "cpu")
    assert missing.returncode == 7 and "--file /nonexistent.txt does not exist" in missing.stderr


def test_eval_chunk_size_is_checked_before_the_model_loads():
    for cmd in (["ppl"], ["passkey", "--lengths", "128"]):
        r = salactl("eval", *cmd, "--chunk-size", "0", "--device", "cpu")
        assert r.returncode == 2 and r.stderr.strip() == "error: --chunk-size must be a positive token count, got 0"


def test_eval_warns_past_the_trained_length_and_still_runs():
    r = salactl("eval", "ppl", "--seq-len", "70000", "--max-tokens", "40", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    assert "--seq-len is 70,000 tokens, past the model's max_position_embeddings (65,536)" in r.stderr


def test_passkey_prompt_has_exact_length_and_hidden_key():
    tok = Tokenizer(EMBEDDED_DIR)
    for length, depth in [(128, 0.0), (300, 0.5), (1000, 1.0)]:
        ids, key = make_passkey_prompt(tok, length, depth, random.Random(length))
        assert len(ids) == length and len(key) == 5
        text = tok.decode(ids)
        assert text.count(key) == 2 and text.rstrip().endswith("The pass key is")
    early, key = make_passkey_prompt(tok, 600, 0.1, random.Random(1))
    late, key2 = make_passkey_prompt(tok, 600, 0.9, random.Random(1))
    assert key == key2 and tok.decode(early).index(key) < 0.2 * 2000 < tok.decode(late).index(key)
    assert extract_answer(" 12345.") == "12345" and extract_answer("no") is None


def test_windows_score_every_token_once():
    ids = list(range(10, 40))
    wins = list(score_windows(ids, 8, None, bos_id=1))
    assert all(w[0] == 1 for w in wins) and [t for w in wins for t in w[1:]] == ids
    assert scored_targets(ids, 8, 9, bos_id=None) == ids[1:8] + ids[8:10]
    uni = unigram_baseline([5, 5, 6, 7], 16)
    assert abs(uni["nll"] - (-(2 * __import__("math").log(0.5) + 2 * __import__("math").log(0.25)) / 4)) < 1e-12


def test_eval_ppl_split_is_checked_and_refused_with_a_file(tmp_path):
    text = tmp_path / "held.txt"
    text.write_text("x = 1\n")
    for args, msg in ((["--split", "heldout", "--file", str(text)], "--split applies to the built-in corpus only"),
                      (["--split", "test"], "unknown --split 'test'; valid: train, heldout")):
        r = salactl("eval", "ppl", "--device", "cpu", *args)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert msg in line, line
