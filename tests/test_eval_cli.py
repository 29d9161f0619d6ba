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
    assert rec["max_tokens"] == 80 and rec["bos"] is True
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
    assert rec["kv_cache_dtype"] == "float32" and len(row["needle_positions"]) == 1
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


def test_eval_ppl_warns_by_the_longest_window_and_still_runs():
    """--max-tokens 40 scores one 41-token window: said, and no false alarm about the trained length
    (tests/test_eval_memory_more.py warns past it with a shorter max_position_embeddings)."""
    r = salactl("eval", "ppl", "--seq-len", "70000", "--max-tokens", "40", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    assert "--seq-len 70,000 is longer than --max-tokens 40 lets a window be" in r.stderr
    assert "max_position_embeddings" not in r.stderr and json.loads(r.stdout)["longest_window"] == 41


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
    uni = unigram_baseline([5, 5, 6, 7])
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


def _ppl_json(*args):
    r = salactl("eval", "ppl", "--device", "cpu", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_eval_ppl_scores_a_bom_file_as_the_plain_file(tmp_path):
    plain, bom = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_text("def add(a, b):\n    return a + b\n", encoding="utf-8")
    bom.write_text("def add(a, b):\n    return a + b\n", encoding="utf-8-sig")
    a, b = _ppl_json("--file", str(plain)), _ppl_json("--file", str(bom))
    assert (a["nll"], a["tokens"]) == (b["nll"], b["tokens"])


def test_text_file_byte_offsets_count_the_byte_order_mark(tmp_path):
    from salactl.errors import DatasetError
    from salactl.input_files import read_text_option

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xef\xbb\xbfab\xff")
    try:
        read_text_option(bad, "--file")
    except DatasetError as e:
        assert "at byte offset 5" in str(e), e
    else:
        raise AssertionError("invalid UTF-8 was read")


def test_eval_ppl_scores_special_token_text_as_text(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    text = "x = '<s>' + y + \"</s>\"  # <unk>\n"
    file = tmp_path / "specials.txt"
    file.write_text(text)
    hf = HFTokenizer.from_file(str(EMBEDDED_DIR / "tokenizer.json"))
    with_specials = len(hf.encode(text, add_special_tokens=False).ids)
    hf.encode_special_tokens = True
    as_text = len(hf.encode(text, add_special_tokens=False).ids)
    assert as_text > with_specials
    rec = _ppl_json("--file", str(file))
    assert rec["tokens"] == as_text and rec["bos"] is True and rec["max_tokens"] == 16384
    # `run --prompt` keeps HF's default: a literal <s> is the BOS id
    tok = Tokenizer(EMBEDDED_DIR)
    assert tok.bos_id in tok.encode("a <s> b", add_special_tokens=False)
    assert tok.bos_id not in tok.encode("a <s> b", add_special_tokens=False, specials_as_text=True)


def test_eval_ppl_too_short_says_how_many_tokens_it_needs(tmp_path):
    empty, one = tmp_path / "empty.txt", tmp_path / "one.txt"
    empty.write_text("")
    one.write_text("x")
    r = salactl("eval", "ppl", "--file", str(empty), "--device", "cpu")
    assert r.returncode == 7, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"error: --file {empty} is too short to score: it has 0 token(s) "
                                                 "and needs at least 1; give a longer text")
    assert _ppl_json("--file", str(one))["tokens"] == 1     # <s> + 1 text token


def test_perplexity_without_bos_needs_two_tokens():
    from salactl.errors import DatasetError
    from salactl.evaluation.perplexity import perplexity
    from salactl.runtime.loader import load_model

    lm = load_model("sala-nano", "cpu")
    try:
        perplexity(lm.model, [5], 8, None, bos_id=None)
    except DatasetError as e:
        assert str(e) == "the text is too short to score: it has 1 token(s) and needs at least 2; give a longer text"
    else:
        raise AssertionError("one token without <s> was scored")


def test_eval_passkey_records_kv_cache_dtype_and_needle_positions():
    r = salactl("eval", "passkey", "--lengths", "100", "--depths", "0.2,0.8", "--trials", "1",
                "--kv-cache-dtype", "fp8_e5m2", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["kv_cache_dtype"] == "fp8_e5m2"
    (early,), (late,) = (row["needle_positions"] for row in rec["results"])
    assert early < late


def test_eval_passkey_kv_cache_dtype_errors():
    e4m3 = salactl("eval", "passkey", "--lengths", "100", "--kv-cache-dtype", "fp8_e4m3", "--device", "cpu")
    assert e4m3.returncode == 3 and e4m3.stdout == "", e4m3.stderr
    (line,) = e4m3.stderr.strip().splitlines()
    assert "fp8_e4m3 needs calibrated k/v scales" in line
    bad = salactl("eval", "passkey", "--kv-cache-dtype", "fp9", "--device", "cpu")
    assert bad.returncode == 2 and "valid: auto, bf16, fp8_e4m3, fp8_e5m2" in bad.stderr


def test_passkey_needle_positions_point_at_the_needle():
    from salactl.evaluation.passkey import NEEDLE, passkey_trials

    tok = Tokenizer(EMBEDDED_DIR)
    for p in passkey_trials(tok, [80, 300], [0.0, 0.5, 1.0], 2, 3):
        needle = tok.encode(NEEDLE.format(key=p["key"]), add_special_tokens=False)
        assert p["ids"][p["needle_at"]:p["needle_at"] + len(needle)] == needle


def test_eval_passkey_warns_when_the_answer_runs_past_the_trained_length(tmp_path):
    model = tmp_path / "nano-max-pos-132"
    model.mkdir()
    for f in EMBEDDED_DIR.iterdir():
        (model / f.name).symlink_to(f)
    config = json.loads((EMBEDDED_DIR / "config.json").read_text())
    (model / "config.json").unlink()
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 132}))
    r = salactl("eval", "passkey", "--model", str(model), "--lengths", "128", "--depths", "0.5", "--trials", "1",
                "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    assert ("the longest --lengths plus the 8 answer tokens is 136 tokens, past the model's "
            "max_position_embeddings (132)") in r.stderr


def test_find_tokenizer_takes_a_string_model_dir():
    from salactl.runtime.tokenizer import find_tokenizer

    tok = find_tokenizer(None, str(EMBEDDED_DIR))
    assert tok.encode("hello world") == Tokenizer(EMBEDDED_DIR).encode("hello world")


def test_eval_ppl_takes_kv_cache_dtype_and_records_what_scored(nano_rtn_dir):
    """--kv-cache-dtype reaches the scoring engine (chunks after the first read the FP8 cache), and the
    record names the weights and KV as `run` does, and a checkpoint directory by its absolute path."""
    args = ("eval", "ppl", "--model", nano_rtn_dir.name, "--seq-len", "48", "--max-tokens", "40",
            "--chunk-size", "16", "--device", "cpu", "--json")
    records = {}
    for kv in ("auto", "fp8_e5m2"):
        r = subprocess.run([sys.executable, "-m", "salactl", *args, "--kv-cache-dtype", kv], capture_output=True,
                           text=True, timeout=300, cwd=nano_rtn_dir.parent)
        assert r.returncode == 0, r.stderr
        records[kv] = json.loads(r.stdout)
    auto, fp8 = records["auto"], records["fp8_e5m2"]
    assert auto["model"] == fp8["model"] == str(nano_rtn_dir.resolve())
    assert auto["weights"] == fp8["weights"] == "w4a16"
    assert (auto["kv_cache_dtype"], fp8["kv_cache_dtype"]) == ("float32", "fp8_e5m2")
    assert auto["tokens"] == fp8["tokens"] == 40 and auto["nll"] != fp8["nll"]
    preset = _ppl_json("--max-tokens", "8", "--seq-len", "8")
    assert (preset["model"], preset["weights"], preset["kv_cache_dtype"]) == (str(EMBEDDED_DIR), "float32", "float32")


def test_eval_ppl_kv_cache_dtype_errors_before_scoring():
    bad = salactl("eval", "ppl", "--kv-cache-dtype", "fp9", "--device", "cpu")
    assert bad.returncode == 2 and "valid: auto, bf16, fp8_e4m3, fp8_e5m2" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    e4m3 = salactl("eval", "ppl", "--kv-cache-dtype", "fp8_e4m3", "--max-tokens", "8", "--seq-len", "9",
                   "--device", "cpu")
    assert e4m3.returncode == 3 and e4m3.stdout == "", e4m3.stderr
    (line,) = e4m3.stderr.strip().splitlines()
    assert "fp8_e4m3 needs calibrated k/v scales" in line
