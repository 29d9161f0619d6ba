"""`salactl eval`'s memory, further: ppl encodes only the text it scores (in pieces whose ids are the
whole text's), passkey counts the weights and the KV cache's growth before loading, and ppl says
when --max-tokens cuts its windows short and records the longest one."""

import json
import random
import subprocess
import sys

import pytest
import torch

from salactl.bench.sweep_sizes import prefill_bytes
from salactl.data.corpus import corpus_text
from salactl.evaluation import perplexity as ppl
from salactl.evaluation.passkey import ANSWER_TOKENS, passkey_memory_bytes
from salactl.bench.sweep_sizes import kv_capacity, kv_growth_bytes
from salactl.evaluation.perplexity import encode_text, engine_prefill_bytes, model_weight_bytes
from salactl.profiling.preflight import largest_fitting
from salactl.runtime.engine import Engine
from salactl.runtime.loader import EMBEDDED_DIR, load_model, model_config
from salactl.runtime.presets import sala_nano
from salactl.runtime.tokenizer import Tokenizer
from salactl.units import human_bytes
from test_run_memory_checks import avail_or_skip, limited, one_error_line

NANO = model_config("sala-nano")
PIECES = ["a", "b", " ", "  ", "\n", "\n\n", "\r\n", "\t", "1", "23", "'s", "'ll", "<s>", "</s>", "<unk>", "é",
          "中文", "😀", "?!", ".", "\u00a0", "\u2028", "\x1c", " \n ", "x = 1\n", "    return y\n"]


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def texts() -> list[str]:
    rng = random.Random(0)
    return [corpus_text("heldout")[:20000], *("".join(rng.choice(PIECES) for _ in range(2000)) for _ in range(12))]


def count_cuts(monkeypatch) -> dict:
    """How many pieces ended at a cut (and how many ran to the text's end)."""
    seen = {"cut": 0, "end": 0}
    real = ppl._next_cut

    def spy(*args):
        end, tries = real(*args)
        seen["end" if tries == 0 else "cut"] += 1
        return end, tries
    monkeypatch.setattr(ppl, "_next_cut", spy)
    return seen


def test_encoding_in_pieces_gives_the_whole_texts_ids(monkeypatch):
    """sala-nano's GPT-2-style tokenizer splits where the pieces are cut: every cut holds, and the ids
    (or their first `limit`) are those of one encode of the whole text, special-token text included."""
    tok = Tokenizer(EMBEDDED_DIR)
    cuts = count_cuts(monkeypatch)
    for text in texts():
        whole = tok.encode(text, add_special_tokens=False, specials_as_text=True)
        for piece in (40, 700):
            assert encode_text(tok, text, None, "t", piece) == whole
            for limit in (1, 33, len(whole) // 2, len(whole) + 3):
                assert encode_text(tok, text, limit, "t", piece) == whole[:limit]
    assert cuts["cut"] > 50 * cuts["end"]


def test_a_tokenizer_that_does_not_split_at_cuts_is_encoded_whole(tmp_path, monkeypatch):
    """A SentencePiece-style tokenizer puts a word-start mark at the start of every string: cuts do not
    hold, so after a few tries the rest is encoded as one piece, and the ids stay exact."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(1)
    text = "".join(rng.choice(["alpha", "beta", "x", "=", "1", "\n", "\n\n"]) + rng.choice([" ", "", "\n"])
                   for _ in range(3000))
    hf = HFTokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    hf.decoder = decoders.Metaspace()
    hf.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    tok = Tokenizer(tmp_path)
    cuts = count_cuts(monkeypatch)
    assert encode_text(tok, text, None, "t", 40) == tok.encode(text, add_special_tokens=False, specials_as_text=True)
    assert cuts["cut"] < 5 < len(text) // 40


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_eval_ppl_encodes_only_the_tokens_it_scores(tmp_path):
    """An 8 MB file needs ~1.4 GB to encode whole; --max-tokens 100 scores its first 100 tokens within
    600 MB over the loaded modules."""
    big = tmp_path / "big.txt"
    code = corpus_text("heldout")
    big.write_text(code * (8_000_000 // len(code) + 1))
    r = limited(600_000_000, "eval", "ppl", "--file", big, "--max-tokens", 100, "--seq-len", 64, "--device",
                "cpu", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(r.stdout)
    assert record["tokens"] == 100 and record["windows"] == 2 and record["longest_window"] == 64
    small = tmp_path / "small.txt"
    small.write_text(code[:4000])
    assert json.loads(salactl("eval", "ppl", "--file", small, "--max-tokens", 100, "--seq-len", 64, "--device",
                              "cpu", "--json").stdout)["nll"] == record["nll"]


def test_ppl_says_when_max_tokens_cuts_the_window_and_records_the_longest():
    r = salactl("eval", "ppl", "--seq-len", 65536, "--max-tokens", 40, "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["seq_len"] == 65536 and record["longest_window"] == 41 and record["windows"] == 1
    assert ("warning: --seq-len 65,536 is longer than --max-tokens 40 lets a window be: one window of at most 41 "
            "tokens is scored; pass --max-tokens 0 (the whole text) or --max-tokens 65,535 or more") in r.stderr
    assert "max_position_embeddings" not in r.stderr           # 41 tokens are well inside the trained length
    full = salactl("eval", "ppl", "--seq-len", 40, "--max-tokens", 78, "--device", "cpu", "--json")
    assert full.returncode == 0 and "warning" not in full.stderr, full.stderr
    assert json.loads(full.stdout)["longest_window"] == 40


def test_ppl_does_not_blame_max_tokens_when_the_text_is_the_limit(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("short text here. just a few words.\n")
    r = salactl("eval", "ppl", "--file", short, "--max-tokens", 100, "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["longest_window"] < 100 and "--max-tokens" not in r.stderr, r.stderr


def model_with(tmp_path, **config) -> str:
    """sala-nano's checkpoint (its files linked) with config.json keys replaced."""
    model = tmp_path / "nano-copy"
    model.mkdir()
    for f in EMBEDDED_DIR.iterdir():
        if f.name != "config.json":
            (model / f.name).symlink_to(f)
    (model / "config.json").write_text(json.dumps({**json.loads((EMBEDDED_DIR / "config.json").read_text()),
                                                   **config}))
    return str(model)


def test_ppl_warns_past_the_trained_length_by_the_longest_window(tmp_path):
    model = model_with(tmp_path, max_position_embeddings=64)
    past = salactl("eval", "ppl", "--model", model, "--seq-len", 80, "--max-tokens", 160, "--device", "cpu")
    assert past.returncode == 0, past.stderr
    assert "warning: --seq-len is 80 tokens, past the model's max_position_embeddings (64)" in past.stderr
    cut = salactl("eval", "ppl", "--model", model, "--seq-len", 80, "--max-tokens", 70, "--device", "cpu")
    assert cut.returncode == 0, cut.stderr
    assert ("warning: the longest window scored is 71 tokens, past the model's max_position_embeddings (64)"
            in cut.stderr)
    inside = salactl("eval", "ppl", "--model", model, "--seq-len", 80, "--max-tokens", 40, "--device", "cpu")
    assert inside.returncode == 0 and "max_position_embeddings" not in inside.stderr, inside.stderr


@pytest.mark.parametrize("prompt, chunk, new", [(300, 64, 0), (256, 256, 3), (1000, 300, 40), (700, 700, 1),
                                                (513, 128, 600)])
def test_kv_capacity_is_the_reference_engines(prompt, chunk, new):
    """The engine's caches after a prefill of `prompt` tokens `chunk` at a time and `new` decode steps
    have the capacity kv_capacity says, and grew last from the capacity it says."""
    engine = Engine(load_model("sala-nano", "cpu").model, torch.device("cpu"), chunk_size=chunk)
    seq = engine.new_sequence()
    layer = NANO.sparse_layers[0]
    capacities = [seq._k[layer].shape[0]]
    for c0 in range(0, prompt, chunk):
        engine.forward(seq, [5] * min(chunk, prompt - c0))
        capacities.append(seq._k[layer].shape[0])
    for _ in range(new):
        engine.forward(seq, [5])
        capacities.append(seq._k[layer].shape[0])
    grown = sorted(set(capacities))
    assert kv_capacity(prompt, prompt + new, chunk) == (grown[-1], grown[-2] if len(grown) > 1 else 0)
    assert {seq._v[i].shape[0] for i in NANO.sparse_layers} == {grown[-1]}


def test_passkey_counts_the_kv_cache_at_its_peak():
    """Past a doubling, the cache holds up to twice the tokens in it, and one layer's old values
    while they are copied: the prefill counts both."""
    length, chunk = 16385, 512
    cached = length + ANSWER_TOKENS
    capacity, before = kv_capacity(length, cached, chunk)
    assert (capacity, before) == (32768, 16384)
    one = NANO.num_key_value_heads * NANO.head_dim * 4
    growth = kv_growth_bytes(NANO, length, cached, chunk, 4)
    assert growth == one * (2 * len(NANO.sparse_layers) * (capacity - cached) + before)
    _, prefill = passkey_memory_bytes(NANO, 4, [length, 100], [0.5], 1, chunk)
    assert prefill == prefill_bytes(NANO, length, cached, 1, chunk, NANO.sparse_config.dense_len, 4) + growth
    assert prefill == engine_prefill_bytes(NANO, length, cached, chunk, 4)


def test_eval_passkey_counts_the_weights_before_loading_them(tmp_path):
    """A checkpoint whose weights take ~65% of the memory and a passkey prefill of ~65% more: each fits,
    both do not, and the check says so before loading (this config's weight file holds no weights: a
    missing one is exit 4 before any memory check, a bad one is found only by loading it)."""
    avail = avail_or_skip()
    vocab = int(0.65 * avail) // (2 * sala_nano().hidden_size * 4)
    model = model_with(tmp_path, vocab_size=vocab)
    for f in tmp_path.joinpath("nano-copy").glob("model*"):
        f.unlink()
    tmp_path.joinpath("nano-copy", "model.safetensors").write_bytes(b"never read: the memory check comes first")
    config = model_config(model)
    weights = model_weight_bytes(config, None, 4)
    length = 200_000
    chunk = largest_fitting(lambda c: engine_prefill_bytes(config, length, length + ANSWER_TOKENS, c, 4)
                            <= 0.65 * avail, length)
    if chunk < 2 or engine_prefill_bytes(config, length, length + ANSWER_TOKENS, chunk, 4) < 0.5 * avail:
        pytest.skip("no --chunk-size makes this passkey prefill ~65% of this machine's memory")
    r = salactl("eval", "passkey", "--model", model, "--lengths", length, "--depths", 0.5, "--trials", 1,
                "--chunk-size", chunk, "--device", "cpu")
    line = one_error_line(r)
    assert line.startswith("error: eval passkey (1 prompt: ") and f"the model's weights: {human_bytes(weights)})" in line
    assert "use --chunk-size " in line and r.stdout == ""
