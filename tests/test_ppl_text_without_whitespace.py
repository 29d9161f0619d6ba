"""`eval ppl` encodes only the tokens it scores of a text without whitespace too (minified JSON, one long
line): encode_text cuts it after punctuation, or every few characters inside a run of letters, and the ids
stay exactly those of encoding the whole text; a run the tokenizer merges in blocks ("-----") is not cut."""

import json
import random
import sys

import pytest

from salactl.evaluation.perplexity import encode_text
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.tokenizer import Tokenizer
from test_run_memory_checks import limited


class CountingTokenizer:
    """The real tokenizer, counting the characters it is asked to encode."""

    def __init__(self):
        self.tok, self.chars = Tokenizer(EMBEDDED_DIR), 0

    def encode(self, text: str, **kwargs) -> list[int]:
        self.chars += len(text)
        return self.tok.encode(text, **kwargs)


def minified_json(entries: int) -> str:
    return json.dumps({f"k{i}": [i, i * 2, "v"] for i in range(entries)}, separators=(",", ":"))


def whole(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False, specials_as_text=True)


def no_whitespace_texts() -> list[str]:
    rng = random.Random(0)
    pieces = ["a", "xyz", "the", "1", "23", "'s", "-", "--", "=", "_", '"', ":", ",", "[", "]", "{", "é", "中文",
              "😀", "<s>", "</s>"]
    return [minified_json(300), "a" * 5000, "-" * 5000, "-=" * 2500, "ss" * 2500, "=" * 700 + "ab" * 2000,
            "".join(rng.choice("abcdefghij") for _ in range(5000)),
            *("".join(rng.choice(pieces) for _ in range(1500)) for _ in range(8))]


def test_a_text_without_whitespace_is_encoded_in_pieces_with_the_whole_texts_ids():
    tok = CountingTokenizer()
    for text in no_whitespace_texts():
        ids = whole(tok.tok, text)
        for piece in (40, 700):
            assert encode_text(tok, text, None, "t", piece) == ids, text[:40]
            for limit in (1, 33, len(ids) // 2):
                assert encode_text(tok, text, limit, "t", piece) == ids[:limit], text[:40]


def test_only_the_start_of_a_long_line_is_encoded_for_a_few_tokens():
    """A 3 MB minified JSON, and a 1 MB run of one letter the tokenizer does not merge: 101 ids ask the
    tokenizer for a piece and the checks around its cut, not the whole text."""
    for text in (minified_json(100_000), "a" * 1_000_000):
        tok = CountingTokenizer()
        ids = encode_text(tok, text, 101, "t", 1000)
        assert tok.chars < 10_000 < len(text)
        assert ids == whole(tok.tok, text[:1000])[:101]


def test_a_run_the_tokenizer_merges_in_blocks_is_not_cut():
    """sala-nano merges "-" in blocks of up to 32 counted from the run's start, so a cut inside the run
    would shift them: the run is encoded whole, and exactly."""
    tok = CountingTokenizer()
    text = "-" * 100_000
    assert encode_text(tok, text, 5, "t", 1000) == whole(tok.tok, text)[:5]
    assert tok.chars >= len(text)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_eval_ppl_of_a_large_minified_json_encodes_only_what_it_scores(tmp_path):
    """An 8 MB single-line JSON needs ~3 GB to encode whole; --max-tokens 100 scores its first 100 tokens
    within 600 MB over the loaded modules, as scoring the file's first 4,000 characters does."""
    text = minified_json(600_000)
    big = tmp_path / "big.json"
    big.write_text(text)
    assert len(text) > 8_000_000 and " " not in text and "\n" not in text
    r = limited(600_000_000, "eval", "ppl", "--file", big, "--max-tokens", 100, "--seq-len", 101, "--device",
                "cpu", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(r.stdout)
    assert record["tokens"] == 100 and record["windows"] == 1
    small = tmp_path / "small.json"
    small.write_text(text[:4000])
    r = limited(600_000_000, "eval", "ppl", "--file", small, "--max-tokens", 100, "--seq-len", 101, "--device",
                "cpu", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["nll"] == record["nll"]
