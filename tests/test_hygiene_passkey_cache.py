"""The passkey prompt's per-tokenizer cache lives as long as its tokenizer: it does not grow with
every tokenizer loaded, and a new tokenizer never gets the ids of one that was freed."""

import gc
import random
from pathlib import Path

from salactl.evaluation.passkey import _Segments, make_passkey_prompt
from salactl.runtime.tokenizer import find_tokenizer
from bench_tokenizer import make_tokenizer

NANO = str(Path(__file__).resolve().parent.parent / "runtime" / "models" / "sala-nano")


def _prompt(tokenizer) -> list[int]:
    return make_passkey_prompt(tokenizer, 256, 0.5, random.Random(0))[0]


def test_cache_entries_go_with_their_tokenizer():
    before = len(_Segments._cache)
    for _ in range(5):
        _prompt(find_tokenizer(NANO, None))
    gc.collect()
    assert len(_Segments._cache) == before


def test_a_new_tokenizer_never_gets_a_freed_ones_ids(tmp_path):
    """A tokenizer made right after another is freed often takes its memory, so its id()."""
    small = find_tokenizer(str(make_tokenizer(tmp_path / "tok", vocab_size=300)), None)
    want = _prompt(small)
    cls, state = type(small), vars(small)
    for _ in range(20):
        _prompt(find_tokenizer(NANO, None))       # cached, then freed at once
        twin = cls.__new__(cls)                   # allocated first thing: mostly in the freed one's place
        twin.__dict__.update(state)
        assert _prompt(twin) == want
