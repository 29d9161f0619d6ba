"""`salactl run --prompt-ids` outside the model's vocabulary (negative, or past it) is one usage line
naming the flag, before the weights load: it was found by the engine only after loading them (about
5 minutes for `--model sala-9b --random-weights --dtype bf16` on a CPU), and a negative id was
reported as "prompt_ids must hold token ids >= 0" from the detokenizer."""

import pytest
import torch

from conftest import run_cli, tiny_config
from salactl.errors import UsageError
from salactl.run_job import RunRequest, execute
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint


@pytest.fixture(scope="module")
def unloadable_ckpt(tmp_path_factory):
    """A checkpoint whose weights file is cut short: reading the weights fails (exit 4), so a refusal
    that comes first was made before they load."""
    cfg = tiny_config()             # vocab_size 512
    ckpt = save_checkpoint(random_state_dict(cfg, "cpu", torch.float32, 0), cfg.to_hf_dict(),
                           tmp_path_factory.mktemp("ckpt") / "model")
    weights = ckpt / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size - 1000)
    return ckpt


@pytest.mark.parametrize("ids, bad", [("1,512", 512), ("-3,1", -3), ("1,99999999999999999999", 99999999999999999999)])
def test_prompt_ids_outside_the_vocabulary_are_refused_before_the_weights_load(unloadable_ckpt, capsys, ids, bad):
    code, out, err = run_cli(["run", "--model", unloadable_ckpt, f"--prompt-ids={ids}", "-n", 1, "--json"], capsys)
    assert code == 2 and out == "", err
    assert err == f"error: --prompt-ids: prompt token id {bad} is outside the vocabulary (size 512)\n"


def test_ids_inside_the_vocabulary_reach_the_weights(unloadable_ckpt, capsys):
    code, out, err = run_cli(["run", "--model", unloadable_ckpt, "--prompt-ids", "1,511", "-n", 1, "--json"], capsys)
    assert code == 4 and "not a complete safetensors file" in err


def test_run_request_prompt_ids_are_checked_before_the_weights_load(unloadable_ckpt):
    with pytest.raises(UsageError, match=r"^--prompt-ids: prompt token id 600 is outside"):
        execute(RunRequest(prompt_ids=[1, 600], model=str(unloadable_ckpt), max_new_tokens=1, device="cpu"))
