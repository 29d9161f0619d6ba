"""`salactl eval`'s memory: the checks before a run (called directly with sizes no machine holds,
nothing allocated) and an allocation failure during one (a real one, under an address-space limit)."""

import os
import re
import subprocess
import sys

import pytest
import torch

from salactl.errors import CapacityError
from salactl.evaluation.passkey import check_passkey_memory, passkey_memory_bytes
from salactl.evaluation.perplexity import check_perplexity_memory, perplexity_memory_bytes
from salactl.runtime.loader import available_host_bytes, model_config

NANO = model_config("sala-nano")
CPU = torch.device("cpu")
HUGE = 1 << 20      # 1M tokens in one prefill chunk: terabytes of attention scores


def _capacity_error(check, *args) -> str:
    with pytest.raises(CapacityError) as e:
        check(*args)
    (line,) = str(e.value).splitlines()
    return line


def test_passkey_memory_check_counts_the_prefill_chunk_and_names_one_that_fits():
    line = _capacity_error(check_passkey_memory, NANO, CPU, 4, [HUGE], [0.5], 1, HUGE)
    assert "attention scores" in line and f"--chunk-size {HUGE:,}" in line
    fits = int(re.search(r"use --chunk-size ([\d,]+) or less", line).group(1).replace(",", ""))
    prompts, prefill = passkey_memory_bytes(NANO, 4, [HUGE], [0.5], 1, fits)
    assert 1 <= fits < HUGE and prompts + prefill <= 1.05 * available_host_bytes()
    check_passkey_memory(NANO, CPU, 4, [HUGE], [0.5], 1, 16)         # the same prompt, small chunks


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_passkey_memory_check_counts_attention_scores_on_the_gpu():
    assert "cuda" in _capacity_error(check_passkey_memory, NANO, torch.device("cuda"), 2, [HUGE], [0.5], 1, HUGE)


def test_ppl_memory_check_counts_the_prefill_and_the_logits():
    logits = 3 * 4 * HUGE * NANO.vocab_size     # three fp32 copies of [window, vocab]: 48 GiB
    if logits < available_host_bytes():
        pytest.skip("this machine holds a 1M-token window's logits")
    line = _capacity_error(check_perplexity_memory, NANO, CPU, 4, HUGE, 512)
    assert "3 copies of the window's fp32 logits" in line and line.endswith("use a shorter --seq-len (or --max-tokens)")
    assert perplexity_memory_bytes(NANO, 4, HUGE, 512) > logits
    check_perplexity_memory(NANO, CPU, 4, 1024, 512)


def test_eval_ppl_refuses_a_window_that_cannot_fit_before_scoring(tmp_path):
    text = tmp_path / "long.txt"
    text.write_text("x = 1\n" * 40000)
    window, chunk = 65536, 65536
    if perplexity_memory_bytes(NANO, 4, window, chunk) < available_host_bytes():
        pytest.skip("this machine could score the window")
    r = subprocess.run([sys.executable, "-m", "salactl", "eval", "ppl", "--file", str(text), "--seq-len",
                        str(window), "--chunk-size", str(chunk), "--max-tokens", "0", "--device", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 11 and r.stdout == "", r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: eval ppl (the longest window's prefill, 65,536 tokens at --chunk-size 65,536")


# the runtime modules load before the address-space limit, which then leaves 600 MB for the run:
# enough to load sala-nano and tokenize, not for one 16,384-token chunk's 1 GB attention scores
LIMITED = """
import resource, sys
import salactl.cli, salactl.cmd_eval, salactl.runtime.engine, salactl.runtime.loader, tokenizers, torch
import salactl.runtime.host_memory as host_memory
host_memory._address_space_available = lambda proc: None   # the checks see no limit, as with one a container hides
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 600_000_000, resource.RLIM_INFINITY))
sys.argv = ["salactl", *sys.argv[1:]]
salactl.cli.main()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("command, fix", [
    (["ppl", "--seq-len", "16384", "--max-tokens", "16383"], "lower --chunk-size or --seq-len"),
    (["passkey", "--lengths", "16384", "--depths", "0.5", "--trials", "1"], "lower --chunk-size or the longest --lengths"),
])
def test_eval_out_of_memory_is_a_capacity_error(command, fix):
    if perplexity_memory_bytes(NANO, 4, 16384, 16384) > available_host_bytes():
        pytest.skip("the memory check before the run would refuse it")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}       # no per-core thread stacks inside the limit
    r = subprocess.run([sys.executable, "-c", LIMITED, "eval", *command, "--chunk-size", "16384", "--device", "cpu"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 11 and r.stdout == "", r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: eval {command[0]} ran out of memory (") and line.endswith(fix), line
