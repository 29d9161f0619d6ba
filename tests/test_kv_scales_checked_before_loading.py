"""fp8_e4m3 without calibrated KV scales is refused from the checkpoint's tensor names, before any
weight loads: on a checkpoint whose weights cannot load (a tensor of the wrong shape), run, eval
and bench answer the missing scales (exit 3), while fp8_e5m2, which needs none, reaches the load
(exit 4)."""

import pytest
import torch

from conftest import run_cli, tiny_config
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.presets import sala_nano

COMMANDS = {
    "run": ["run", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"],
    "eval": ["eval", "ppl", "--max-tokens", "64"],
    "bench": ["bench", "--scale", "0.002", "--num-requests", "1"],
}


@pytest.fixture(scope="module")
def unloadable_checkpoint(tmp_path_factory):
    """With sala-nano's tokenizer (and vocabulary), which eval checks before the load."""
    cfg = tiny_config().replace(vocab_size=sala_nano().vocab_size)
    state = random_state_dict(cfg, "cpu", torch.float32, 0)
    state["model.norm.weight"] = torch.ones(3)            # load_model refuses this shape
    tokenizer = {f: EMBEDDED_DIR / f for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")}
    return save_checkpoint(state, cfg.to_hf_dict(), tmp_path_factory.mktemp("kv") / "ckpt", extra_files=tokenizer)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_missing_e4m3_scales_are_refused_before_the_weights_load(command, unloadable_checkpoint, tmp_path,
                                                                  capsys):
    args = [*COMMANDS[command], "--model", unloadable_checkpoint]
    if command == "bench":
        args += ["--out", tmp_path / "b"]
    code, _, err = run_cli([*args, "--kv-cache-dtype", "fp8_e4m3"], capsys)
    assert code == 3, err
    assert err.strip().splitlines()[-1].startswith("error: --kv-cache-dtype fp8_e4m3 needs calibrated k/v scales")
    code, _, err = run_cli([*args, "--kv-cache-dtype", "fp8_e5m2"], capsys)
    assert code == 4 and "model.norm.weight" in err, err
