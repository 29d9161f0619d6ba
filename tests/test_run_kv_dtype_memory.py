"""`salactl run`'s size check counts the KV cache in --kv-cache-dtype (1 byte an element in FP8, plus
the reference engine's dequantized copy of one sparse layer) and its exit-11 refusal names the
largest --max-new-tokens that fits."""

import re
import subprocess
import sys

import pytest
import torch

from salactl.bench.sweep_sizes import kv_capacity, sweep_prefill_bytes
from salactl.errors import CapacityError
from salactl.evaluation.perplexity import model_weight_bytes
from salactl.run_job import RunRequest, _check_memory
from salactl.runtime.loader import available_host_bytes, model_config
from salactl.units import human_bytes

NANO = model_config("sala-nano")
WEIGHTS = model_weight_bytes(NANO, None, 4)        # fp32 on CPU
PROMPT, CHUNK = 3, 512


def need(new_tokens: int, kv: str, prompt: int = PROMPT, chunk: int = CHUNK) -> int:
    total = prompt + new_tokens - 1                 # the last token is never fed
    return sweep_prefill_bytes(NANO, prompt, total, 1, chunk, NANO.sparse_config.dense_len, 4, kv)


def refusal(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "salactl", "run", "--prompt-ids", "1,2,3", "--device", "cpu",
                        "--json", *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 11, (r.returncode, r.stderr[-2000:])
    assert r.stdout == "" and "Traceback" not in r.stderr
    return r.stderr.strip().splitlines()[-1]


def test_fp8_kv_counts_one_byte_an_element_and_the_dequantized_layer_by_hand():
    """sala-nano (2 KV heads x 32 dims, 2 sparse layers), fp32 activations, 2**24 tokens cached: the
    cache grows to exactly 2**24 from 2**23, so fp32 KV minus FP8 KV is 3 bytes for each of
    2 x 2 x 64 x 2**24 elements plus the last layer's old values (64 x 2**23), less one layer's K and V
    dequantized (4 bytes each) with fp32 temporaries (8 bytes) alive: 12 x 64 x 2**24."""
    tokens = 2 ** 24
    assert kv_capacity(PROMPT, tokens, CHUNK) == (2 ** 24, 2 ** 23)
    n = tokens - PROMPT + 1
    assert need(n, "bf16") - need(n, "fp8_e5m2") == 3 * (2 * 2 * 64 * 2 ** 24 + 64 * 2 ** 23) - 12 * 64 * 2 ** 24
    assert need(n, "fp8_e4m3") == need(n, "fp8_e5m2") and need(n, "auto") == need(n, "bf16")


def test_the_refusal_counts_the_kv_dtype_and_names_a_max_new_tokens_that_fits():
    n = 1_000_000_000                  # past any host memory, in FP8 too
    lines = {kv: refusal("--max-new-tokens", n, "--kv-cache-dtype", kv) for kv in ("bf16", "fp8_e5m2")}
    for kv, line in lines.items():
        assert f"needs {human_bytes(need(n, kv) + WEIGHTS)}, but" in line, line
        assert f" KV cache in {'float32' if kv == 'bf16' else kv}, " in line, line
        avail = float(re.search(r"this machine has ([\d.]+) GiB available", line).group(1)) * 2 ** 30
        most = int(re.search(r"use --max-new-tokens ([\d,]+) or fewer \(the most that fit after this prompt\)$",
                             line).group(1).replace(",", ""))
        slack = 0.05 * 2 ** 30                      # the GiB figure's rounding
        assert need(most, kv) + WEIGHTS <= avail + slack < need(most + most // 50, kv) + WEIGHTS, line
    assert need(n, "fp8_e5m2") < 0.9 * need(n, "bf16")         # 0.88 here: the KV cache is most of it


def test_a_length_that_fits_only_with_fp8_kv_passes_the_check():
    avail = available_host_bytes()
    if avail is None:
        pytest.skip("available host memory unknown")
    # the cache grows from a first chunk of c > 512 tokens to c * 2**k (c moves those sizes onto this
    # machine's); one token past a growth, fp8 saves most
    def separates(c: int, n: int) -> bool:
        fp8, fp32 = (need(n, kv, c, c) + WEIGHTS for kv in ("fp8_e5m2", "bf16"))
        return fp8 <= 0.9 * avail and fp32 >= 1.1 * avail
    c, n = next(((c, c * 2 ** k - c + 2) for c in range(520, 1040, 8) for k in range(30)
                 if separates(c, c * 2 ** k - c + 2)), (0, 0))
    if not n:
        pytest.skip("no length separates fp8 from fp32 KV by 10% of this machine's memory")
    for kv, fits in (("fp8_e5m2", True), ("bf16", False)):
        req = RunRequest(prompt_ids=[1] * c, device="cpu", max_new_tokens=n, kv_cache_dtype=kv, chunk_size=c)
        if fits:
            _check_memory(req, NANO, torch.device("cpu"), torch.float32, c)
        else:
            with pytest.raises(CapacityError, match=r"--max-new-tokens [\d,]+ or fewer"):
                _check_memory(req, NANO, torch.device("cpu"), torch.float32, c)


def test_a_prompt_that_alone_does_not_fit_says_so():
    req = RunRequest(prompt_ids=[1] * 10, device="cpu", max_new_tokens=1, chunk_size=10)
    with pytest.raises(CapacityError, match=r"use a shorter prompt \(at --chunk-size 10 the prompt alone does not"):
        _check_memory(req, NANO, torch.device("cpu"), torch.float32, 10 ** 12)
