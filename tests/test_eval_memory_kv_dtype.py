"""eval's pre-flight memory check counts the KV cache in the chosen --kv-cache-dtype, as run's does
(sweep_prefill_bytes): an FP8 cache's 1-byte elements plus its dequantized temporaries."""

import pytest

from salactl.bench.sweep_sizes import sweep_prefill_bytes
from salactl.errors import CapacityError
from salactl.evaluation.passkey import ANSWER_TOKENS, check_passkey_memory, passkey_memory_bytes
from salactl.evaluation.perplexity import LOGIT_COPIES, check_perplexity_memory, perplexity_memory_bytes
from salactl.runtime.loader import model_config

import torch

NANO = model_config("sala-nano")
WINDOW, CHUNK = 8192, 512


def _run_counts(kv: str, cached: int) -> int:
    return sweep_prefill_bytes(NANO, WINDOW, cached, 1, CHUNK, NANO.sparse_config.dense_len, 2, kv)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2", "bf16"])
def test_eval_counts_the_kv_cache_in_its_dtype_as_run_does(kv):
    logits = LOGIT_COPIES * 4 * WINDOW * NANO.vocab_size
    assert perplexity_memory_bytes(NANO, 2, WINDOW, CHUNK, kv) == _run_counts(kv, WINDOW) + logits
    _, prefill = passkey_memory_bytes(NANO, 2, [WINDOW], [0.5], 1, CHUNK, kv)
    assert prefill == _run_counts(kv, WINDOW + ANSWER_TOKENS)


def test_an_fp8_estimate_differs_from_bf16s():
    assert perplexity_memory_bytes(NANO, 2, WINDOW, CHUNK, "fp8_e4m3") != \
        perplexity_memory_bytes(NANO, 2, WINDOW, CHUNK, "bf16")


@pytest.mark.parametrize("check,args", [
    (check_perplexity_memory, (NANO, torch.device("cpu"), 2, 2**24, 2**24)),
    (check_passkey_memory, (NANO, torch.device("cpu"), 2, [2**24], [0.5], 1, 2**24)),
])
def test_the_capacity_error_names_the_kv_cache_dtype(check, args):
    with pytest.raises(CapacityError, match="KV cache in --kv-cache-dtype fp8_e5m2"):
        check(*args, kv_cache_dtype="fp8_e5m2")
