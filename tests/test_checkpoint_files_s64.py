"""A complete checkpoint saved as PyTorch pickles (pytorch_model.bin, or sharded with
pytorch_model.bin.index.json) is refused as what it is, with the command that converts it, not as a
download that stopped early ("finish the download")."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from salactl.errors import CheckpointError
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from conftest import run_cli


def _nano_state() -> dict[str, torch.Tensor]:
    state = {}
    for f in sorted(EMBEDDED_DIR.glob("*.safetensors")):
        state.update(load_file(f))
    return state


@pytest.fixture(params=["single", "sharded", "tied"])
def bin_ckpt(request, tmp_path):
    d = tmp_path / "bin-ckpt"
    d.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(EMBEDDED_DIR / f, d / f)
    state = _nano_state()
    if request.param == "tied":         # one storage under two names: safetensors refuses to save it as is
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    if request.param in ("single", "tied"):
        torch.save(state, d / "pytorch_model.bin")
    else:
        names = sorted(state)
        shards = {"pytorch_model-00001-of-00002.bin": names[:40], "pytorch_model-00002-of-00002.bin": names[40:]}
        for shard, part in shards.items():
            torch.save({n: state[n] for n in part}, d / shard)
        (d / "pytorch_model.bin.index.json").write_text(json.dumps(
            {"weight_map": {n: shard for shard, part in shards.items() for n in part}}))
    return d


def test_pytorch_bin_weights_are_named_with_the_command_that_converts_them(bin_ckpt, capsys):
    with pytest.raises(CheckpointError, match="holds PyTorch .bin weights .* reads only safetensors") as e:
        load_model(bin_ckpt, device="cpu")
    assert "finish the download" not in str(e.value)
    code, out, err = run_cli(["run", "--model", bin_ckpt, "--prompt-ids", "1,2", "-n", 1, "--json"], capsys)
    assert code == 4 and out == "" and err.count("\n") == 1, err
    assert "pytorch_model" in err and "finish the download" not in err
    command = err.split("convert them: ", 1)[1].strip()
    subprocess.run(command.replace("python ", f"{sys.executable} ", 1), shell=True, check=True)
    code, out, err = run_cli(["run", "--model", bin_ckpt, "--prompt-ids", "1,2", "-n", 1, "--json"], capsys)
    assert code == 0, err


def test_a_directory_without_any_weights_still_says_the_download_stopped(tmp_path):
    shutil.copy(EMBEDDED_DIR / "config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="finish the download"):
        load_model(tmp_path, device="cpu")
