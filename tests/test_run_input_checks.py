"""`salactl run`'s options checked before anything divides by them or drops them: --chunk-size 0 is a
usage error (it was a ZeroDivisionError traceback in the memory check), and a --tokenizer the user
gave that does not load is an error with --prompt-ids too (it was silently dropped: "text": null)."""

import json
import subprocess
import sys

import pytest
import torch

from salactl.errors import UsageError
from salactl.run_job import RunRequest, execute
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from test_quantize_cli import small_config


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("chunk", [0, -1])
def test_a_chunk_size_below_one_is_one_usage_line(chunk):
    r = salactl("run", "--prompt", "hi", "-n", 3, "--chunk-size", chunk, "--device", "cpu")
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"error: chunk_size (--chunk-size) must be a positive integer, got {chunk}\n"


@pytest.mark.parametrize("chunk", [0, 2.5, True])
def test_run_request_chunk_size_is_checked_before_the_memory_check(chunk):
    with pytest.raises(UsageError, match=r"^chunk_size \(--chunk-size\) must be a positive integer, got "):
        execute(RunRequest(prompt="hi", max_new_tokens=3, chunk_size=chunk, device="cpu"))


def test_a_given_tokenizer_that_fails_is_an_error_with_prompt_ids(tmp_path):
    r = salactl("run", "--prompt-ids", "1,2,3", "--tokenizer", tmp_path / "none", "-n", 4, "--json",
                "--device", "cpu")
    assert r.returncode == 5 and r.stdout == "", r.stderr
    # one line naming the path (the wording is runtime/tokenizer.py's)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and str(tmp_path / "none") in r.stderr


def test_prompt_ids_still_run_on_a_checkpoint_without_a_tokenizer(tmp_path):
    config = small_config()
    ckpt = save_checkpoint(random_state_dict(config, "cpu", torch.float32, 0),
                           config.replace(torch_dtype="float32").to_hf_dict(), tmp_path / "ckpt")
    r = salactl("run", "--model", ckpt, "--prompt-ids", "1,2,3", "-n", 2, "--json", "--device", "cpu",
                "--no-op-profile")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["text"] is None and len(got["output_token_ids"]) == 2
