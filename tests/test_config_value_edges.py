"""Config values at the edges of what is accepted: a zero sparse size, a special token id equal to
the vocabulary size, an eos list holding something other than integers, a one-position context,
and the written config."""

import json

import pytest

from salactl.errors import ConfigError
from salactl.runtime.config import SalaConfig, SparseConfig
from salactl.runtime.loader import EMBEDDED_DIR

NANO = json.loads((EMBEDDED_DIR / "config.json").read_text())


@pytest.mark.parametrize("name", ["block_size", "kernel_size", "kernel_stride", "topk"])
def test_a_zero_sparse_size_is_refused(name):
    with pytest.raises(ConfigError, match=f"sparse_config.{name} must be positive, got 0"):
        SparseConfig(**{name: 0})


@pytest.mark.parametrize("name", ["dense_len", "init_blocks", "window_size"])
def test_a_zero_sparse_count_is_accepted(name):
    assert getattr(SparseConfig(**{name: 0}), name) == 0


@pytest.mark.parametrize("key, value", [("eos_token_id", "V"), ("eos_token_id", ["V"]), ("bos_token_id", "V")])
def test_a_special_token_id_equal_to_the_vocabulary_size_is_refused(key, value):
    v = NANO["vocab_size"]
    d = {**NANO, key: v if value == "V" else [v]}
    with pytest.raises(ConfigError, match=f"special token id {v} is outside the vocabulary"):
        SalaConfig.from_hf_dict(d)
    d[key] = v - 1 if value == "V" else [v - 1]
    SalaConfig.from_hf_dict(d)


@pytest.mark.parametrize("eos", [["2"], [2, 1.5], [2, True]])
def test_an_eos_list_of_other_than_integers_is_refused(eos):
    with pytest.raises(ConfigError, match="eos_token_id = .*; expected an integer or a list of integers"):
        SalaConfig.from_hf_dict({**NANO, "eos_token_id": eos})


def test_the_written_config_reads_back_the_same_and_lets_hf_cache():
    cfg = SalaConfig.from_hf_dict(NANO)
    written = cfg.to_hf_dict()
    assert written["use_cache"] is True
    assert SalaConfig.from_hf_dict(written) == cfg


def test_a_context_of_one_position_is_accepted_and_zero_refused():
    assert SalaConfig.from_hf_dict({**NANO, "max_position_embeddings": 1}).max_position_embeddings == 1
    with pytest.raises(ConfigError, match="max_position_embeddings must be at least 1, got 0"):
        SalaConfig.from_hf_dict({**NANO, "max_position_embeddings": 0})
