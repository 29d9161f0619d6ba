"""`salactl run`'s memory: running out during a run is exit 11 with nothing written, and the prompt,
its prefill and the weights are checked before the weights load (sizes no machine holds are only
computed; every run that could allocate much runs under an address-space limit)."""

import json
import os
import re
import subprocess
import sys

import pytest

from salactl.evaluation.perplexity import engine_prefill_bytes, model_weight_bytes
from salactl.input_files import TOKENIZER_BYTES_PER_BYTE
from salactl.profiling.preflight import largest_fitting
from salactl.runtime.loader import EMBEDDED_DIR, available_host_bytes, model_config
from salactl.runtime.presets import sala_nano
from salactl.runtime.tokenizer import Tokenizer
from salactl.units import human_bytes

NANO = model_config("sala-nano")
NANO_WEIGHTS = model_weight_bytes(NANO, None, 4)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status and meminfo")

# the CLI after its modules load, under an address-space limit of what they take plus `extra` bytes
LIMITED = """
import resource, sys
import salactl.cli, salactl.cmd_run, salactl.run_job, salactl.runtime.engine, salactl.runtime.loader, tokenizers, torch
import salactl.runtime.host_memory as host_memory
host_memory._address_space_available = lambda proc: None   # the checks see no limit, as with one a container hides
extra = int(sys.argv.pop(1))
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + extra, resource.RLIM_INFINITY))
sys.argv = ["salactl", *sys.argv[1:]]
salactl.cli.main()
"""


def limited(extra: int, *args, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}       # no per-core thread stacks inside the limit
    return subprocess.run([sys.executable, "-c", LIMITED, str(extra), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 11, (r.returncode, r.stderr[-2000:])
    lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("warning: ")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


def avail_or_skip() -> int:
    avail = available_host_bytes()
    if avail is None:
        pytest.skip("available host memory unknown")
    return avail


@pytest.mark.parametrize("mode", ["stream", "--json", "--out"])
def test_running_out_of_memory_is_exit_11_and_writes_nothing(mode, tmp_path):
    """600 MB over the loaded modules hold sala-nano and its prompt, not one 16,384-token chunk's 1 GB
    attention scores: an allocation fails mid-prefill."""
    prompt, chunk = 16384, 16384
    if engine_prefill_bytes(NANO, prompt, prompt + 1, chunk, 4) + NANO_WEIGHTS > avail_or_skip():
        pytest.skip("the memory check before the run would refuse it")
    extra = {"stream": [], "--json": ["--json"], "--out": ["--out", tmp_path / "out"]}[mode]
    r = limited(600_000_000, "run", "--prompt-ids", ",".join(["5"] * prompt), "--chunk-size", chunk, "-n", 2,
                "--device", "cpu", *extra)
    line = one_error_line(r)
    assert line.startswith("error: run ran out of memory (") and line.endswith(
        "; lower --chunk-size or shorten the prompt"), line
    assert r.stdout == ""
    assert not (tmp_path / "out" / "records.jsonl").exists()


def long_prompt(path, at_least: int) -> int:
    """Writes a prompt file of at least `at_least` tokens (BOS included); returns its token count."""
    text = "x = 1\n" * (at_least // 3)
    tok = Tokenizer(EMBEDDED_DIR)
    while len(tok.encode(text)) < at_least:
        text += text
    path.write_text(text)
    return len(tok.encode(text))


def fitting_chunk(line: str) -> int:
    return int(re.search(r"use --chunk-size ([\d,]+) or less", line).group(1).replace(",", ""))


def test_a_prefill_that_cannot_fit_is_refused_before_loading_with_a_chunk_size_that_fits(tmp_path):
    avail = avail_or_skip()
    prompt = long_prompt(tmp_path / "p.txt", 200_000)
    if engine_prefill_bytes(NANO, prompt, prompt + 1, prompt, 4) < 2 * avail:
        pytest.skip("this machine could hold the prompt in one chunk")
    r = limited(1_500_000_000, "run", "--prompt-file", tmp_path / "p.txt", "--chunk-size", prompt, "-n", 2,
                "--device", "cpu", "--json")
    line = one_error_line(r)
    assert line.startswith(f"error: run (the prompt's prefill, {prompt:,} tokens at --chunk-size {prompt:,}, "
                           "and 2 new tokens: "), line
    assert f"the model's weights: {human_bytes(NANO_WEIGHTS)})" in line
    assert f", or a shorter prompt (at --chunk-size {prompt:,} the prompt alone does not fit)" in line
    chunk = fitting_chunk(line)
    assert 1 <= chunk < prompt
    assert engine_prefill_bytes(NANO, prompt, prompt + 1, chunk, 4) + NANO_WEIGHTS <= 1.05 * avail
    assert r.stdout == ""


@pytest.fixture
def heavy_model(tmp_path):
    """sala-nano's layers with a vocabulary whose random fp32 weights take ~65% of the available host
    memory (config only, beside sala-nano's tokenizer): the weights fit, and so may a prefill, but not
    both."""
    avail = avail_or_skip()
    vocab = int(0.65 * avail) // (2 * sala_nano().hidden_size * 4)          # embeddings and lm_head
    config = sala_nano(vocab_size=vocab)
    model = tmp_path / "heavy"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config.to_hf_dict()))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (EMBEDDED_DIR / name).exists():
            (model / name).symlink_to(EMBEDDED_DIR / name)
    return model, config, avail


def test_the_weights_count_and_a_run_that_cannot_fit_loads_none_of_them(heavy_model, tmp_path):
    """A prefill of ~65% of the memory fits alone, and so do the weights: together they are refused
    before the weights load (under an address-space limit far below the weights)."""
    model, config, avail = heavy_model
    weights = model_weight_bytes(config, None, 4)
    prompt = long_prompt(tmp_path / "p.txt", 200_000)
    chunk = largest_fitting(lambda c: engine_prefill_bytes(config, prompt, prompt, c, 4) <= 0.65 * avail, prompt)
    if chunk < 2 or engine_prefill_bytes(config, prompt, prompt, chunk, 4) < 0.5 * avail:
        pytest.skip("no --chunk-size makes this prompt's prefill ~65% of this machine's memory")
    r = limited(1_500_000_000, "run", "--model", model, "--random-weights", "--prompt-file", tmp_path / "p.txt",
                "--chunk-size", chunk, "-n", 1, "--device", "cpu", "--json")
    line = one_error_line(r)
    assert line.startswith(f"error: run (the prompt's prefill, {prompt:,} tokens at --chunk-size {chunk:,}, "), line
    assert f"the model's weights: {human_bytes(weights)})" in line
    fits = fitting_chunk(line)
    assert fits < chunk and engine_prefill_bytes(config, prompt, prompt, fits, 4) + weights <= 1.05 * avail


def test_a_prompt_the_tokenizer_cannot_hold_is_refused_before_encoding(tmp_path):
    """The tokenizers library aborts the whole process when an allocation fails: a prompt file whose
    encoding cannot fit in the host's memory is exit 11 before encode is called."""
    size = 2 * avail_or_skip() // TOKENIZER_BYTES_PER_BYTE
    if size > 200 * 2**20:
        pytest.skip("this host's memory would need a prompt over 200 MB")
    prompt = tmp_path / "huge.txt"
    prompt.write_text("x = 1\n" * (size // 6 + 1))
    r = limited(1_500_000_000, "run", "--prompt-file", prompt, "-n", 1, "--device", "cpu")
    line = one_error_line(r)
    # the file is read only as far as the tokenizer could encode (test_prompt_file_streams.py)
    assert line.startswith(f"error: --prompt-file {prompt} holds more than "), line
    assert "the most the tokenizer can encode" in line and line.endswith("; shorten the prompt") and r.stdout == ""
