"""Edges of the sweep's accuracy proxies (`salactl.bench.accuracy`) and the bench's Markdown summary
(`salactl.bench.summary`) that the end-to-end tests do not reach."""

import math
import random

import pytest
import torch

from bench_tokenizer import make_tokenizer
from salactl.bench.accuracy import kl_prompt, logit_kl
from salactl.evaluation.passkey import make_passkey_prompt
from salactl.runtime.tokenizer import Tokenizer


def test_logit_kl_max_is_the_worst_position():
    # position 0 agrees exactly, position 1 differs: KL(p_ref ‖ p) with p_ref = (½, ½), p = (¾, ¼)
    reference = torch.zeros(2, 2, dtype=torch.float64)
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]], dtype=torch.float64)
    want = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    got = logit_kl(reference, logits, dense_len=2)
    assert got["logit_kl_max"] == pytest.approx(want, rel=1e-12)
    assert got["logit_kl_mean"] == pytest.approx(want / 2, rel=1e-12)
    assert got["logit_kl_sparse_mean"] == pytest.approx(want, rel=1e-12) and got["kl_sparse_positions"] == 1


def test_kl_prompt_takes_passkey_text_only_when_every_id_is_in_the_vocabulary(tmp_path):
    tok = Tokenizer(make_tokenizer(tmp_path / "tok"))
    text, _ = make_passkey_prompt(tok, 200, 0.5, random.Random(7))
    assert kl_prompt(tok, 200, 4096, 7) == text
    # the text's largest id is one past a vocabulary of max(text) ids: random ids instead
    vocab = max(text)
    ids = kl_prompt(tok, 200, vocab, 7)
    assert ids == kl_prompt(None, 200, vocab, 7) and max(ids) < vocab and len(ids) == 200


def test_summary_table_shows_unbounded_concurrency_as_infinity_and_leaves_missing_metrics_empty():
    from salactl.bench.summary import table_rows

    base = {"phase": "S1", "completed": 3, "failed": 0, "duration": 2.0, "mean_itl_ms": None}
    cols, rows = table_rows({"phases": [dict(base, max_concurrency=None), dict(base, max_concurrency=4)]})
    conc, itl = cols.index("conc"), cols.index("ITL ms")
    assert [r[conc] for r in rows] == ["∞", 4]
    assert [r[itl] for r in rows] == [None, None]


def test_score_line_of_an_unfinished_run_says_incomplete_not_an_error():
    from salactl.bench.scoring import soar_score
    from salactl.bench.summary import score_line

    # phase B never ran (interrupted): no score, and no problem to name
    d = soar_score({"A": 2.0}, {"A": 4.0, "B": 4.0}, {"A": 0.5, "B": 0.5})
    assert d["score"] is None and d["score_error"] is None
    assert score_line({"score_details": d}) == "SOAR score: incomplete (tiers: A 200.00)"


def test_estimated_counts_note_mentions_capping_only_when_a_request_was_capped():
    from salactl.bench.summary import phase_notes

    phase = {"phase": "u", "completed": 2, "failed": 0, "output_len_source": "chunks", "output_len_over_max": 0}
    [note] = phase_notes({"phases": [phase]})
    assert note == "phase u: output tokens counted by chunks (the server reported no usage)"
    [note] = phase_notes({"phases": [dict(phase, output_len_over_max=3)]})
    assert note.endswith("; 3 requests capped at max_tokens")
