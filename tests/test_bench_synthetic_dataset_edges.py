"""Edges of the synthetic request sets (`salactl.bench.synthetic`) and SOAR-format datasets
(`salactl.bench.datasets`) that the end-to-end bench tests do not reach."""

import pytest

from bench_tokenizer import make_tokenizer
from salactl.bench.datasets import SoarRow, read_soar_rows, soar_requests
from salactl.bench.synthetic import SOAR_INPUT_BINS, SOAR_OUTPUT_BINS, random_lengths, soar_like
from salactl.errors import DatasetError, UsageError
from salactl.runtime.tokenizer import Tokenizer


def test_soar_bins_are_the_documented_contiguous_ranges():
    K = 1024
    assert [(lo, hi) for lo, hi, _ in SOAR_INPUT_BINS] == [
        (0, 4 * K), (4 * K, 16 * K), (16 * K, 32 * K), (32 * K, 128 * K), (128 * K, 160 * K)]
    assert [(lo, hi) for lo, hi, _ in SOAR_OUTPUT_BINS] == [
        (0, 512), (512, 2 * K), (2 * K, 4 * K), (4 * K, 16 * K), (16 * K, 32 * K)]
    assert sum(s for *_, s in SOAR_INPUT_BINS) == pytest.approx(1.0)
    assert sum(s for *_, s in SOAR_OUTPUT_BINS) == pytest.approx(1.0)


@pytest.mark.parametrize("make", [lambda n: soar_like(n, 0.01, 512), lambda n: random_lengths(n, 8, 4, 512)])
def test_an_empty_request_set_is_refused(make):
    with pytest.raises(UsageError, match="at least 1 request, got 0"):
        make(0)
    assert len(make(1)) == 1


def test_rows_of_exactly_two_tokens_are_kept_and_shorter_ones_dropped(tmp_path):
    tok = Tokenizer(make_tokenizer(tmp_path / "tok"))
    assert len(tok.encode("x")) == 2 and len(tok.encode("")) == 1         # BOS + "x"; BOS only
    rows = [SoarRow(1, "x", "x"), SoarRow(2, "", "x"), SoarRow(3, "x", "")]
    reqs, too_short = soar_requests(rows, tok, seed=1)
    assert too_short == 2 and [(r.source_line, r.input_len, r.output_len) for r in reqs] == [(1, 2, 2)]


def test_random_lengths_of_one_token_are_allowed():
    [req] = random_lengths(1, 1, 1, 512)
    assert (req.input_len, req.output_len, len(req.prompt_ids)) == (1, 1, 1)


def test_a_dataset_that_is_not_utf8_says_what_to_give(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_bytes(b"\xff\n")
    with pytest.raises(DatasetError, match=r"d.jsonl:1 is not UTF-8 text .*; give SOAR-format JSONL in UTF-8$"):
        read_soar_rows(f)


def test_a_range_ratio_of_one_is_refused():
    with pytest.raises(UsageError, match=r"range_ratio must be in \[0, 1\), got 1.0"):
        random_lengths(2, 8, 4, 512, range_ratio=1.0)


def test_soar_requests_keep_the_first_limit_usable_rows(tmp_path):
    tok = Tokenizer(make_tokenizer(tmp_path / "tok"))
    rows = [SoarRow(i, "the quick brown fox", "the lazy dog") for i in range(1, 5)]
    everything, _ = soar_requests(rows, tok, seed=3)
    first_two, too_short = soar_requests(rows, tok, seed=3, limit=2)
    assert too_short == 0 and [r.source_line for r in first_two] == [r.source_line for r in everything[:2]]


@pytest.mark.parametrize("input_len, output_len", [(0, 4), (4, 0)])
def test_random_lengths_under_one_token_are_refused(input_len, output_len):
    with pytest.raises(UsageError, match="random lengths must be >= 1 token"):
        random_lengths(1, input_len, output_len, 512)


def test_a_scale_of_zero_is_refused():
    with pytest.raises(UsageError, match="--scale must be positive, got 0.0"):
        soar_like(1, 0.0, 512)
