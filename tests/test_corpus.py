"""The stdlib corpus rebuilds deterministically; its hash matches the one recorded for this Python."""

import hashlib

import pytest

from salactl.data import corpus
from salactl.errors import DatasetError


def test_corpus_rebuild_is_deterministic_and_matches_recorded_hash():
    first = corpus.corpus_sha256("heldout")
    corpus.corpus_documents.cache_clear()
    text = corpus.corpus_text("heldout")
    assert hashlib.sha256(text.encode()).hexdigest() == first
    recorded = corpus.recorded_sha256("heldout")
    if recorded is None:
        pytest.skip(f"no hash recorded for Python {corpus.python_version()}; determinism checked only")
    assert first == recorded


def test_train_hash_matches_recorded():
    recorded = corpus.recorded_sha256("train")
    if recorded is None:
        pytest.skip(f"no hash recorded for Python {corpus.python_version()}")
    assert corpus.corpus_sha256("train") == recorded


def test_splits_are_disjoint_by_module_and_documents_are_headed():
    held = {d.split("\n", 1)[0] for d in corpus.corpus_documents("heldout")}
    train = {d.split("\n", 1)[0] for d in corpus.corpus_documents("train")}
    assert held and train and not held & train
    assert all(h.startswith("# ") and h.endswith(".py") for h in held)
    rels = {h[2:] for h in held}
    assert all(corpus.split_of(r) == "heldout" for r in rels)
    assert not any(r.startswith(("test/", "tkinter/", "idlelib/", "encodings/")) for r in rels | {h[2:] for h in train})


def test_unknown_split_is_a_dataset_error():
    with pytest.raises(DatasetError, match="unknown corpus split"):
        corpus.corpus_text("validation")
