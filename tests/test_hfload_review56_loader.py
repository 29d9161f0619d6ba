"""--model resolution next to a directory of a preset's name, and a checkpoint without weight files
(a half-finished download): exit 4 naming the missing files, never a memory error with wrong advice."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.errors import CheckpointError, ConfigError
from salactl.runtime.loader import EMBEDDED_DIR, load_model, model_config, model_dir
from salactl.runtime.presets import sala_9b
from conftest import run_cli

NO_WEIGHTS = "has neither model.safetensors nor model.safetensors.index.json"


def broken_copy(where: Path) -> Path:
    """sala-nano's files under `where`, with a config.json only a directory load reads (exit 3)."""
    shutil.copytree(EMBEDDED_DIR, where)
    d = json.loads((where / "config.json").read_text())
    (where / "config.json").write_text(json.dumps({**d, "mlp_bias": True}))
    return where


def test_a_bare_preset_name_is_the_preset_and_says_how_to_load_the_directory_of_that_name(tmp_path, capsys,
                                                                                           monkeypatch):
    broken_copy(tmp_path / "sala-nano")
    r = subprocess.run([sys.executable, "-m", "salactl", "run", "--model", "sala-nano", "--prompt-ids", "1,2,3",
                        "-n", "2", "--device", "cpu", "--json"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    note = ("model (--model) 'sala-nano' is the sala-nano preset, not the directory ./sala-nano here; "
            "--model ./sala-nano loads that directory")
    assert r.returncode == 0 and r.stderr.splitlines() == [f"warning: {note}"], r.stderr
    monkeypatch.chdir(tmp_path)
    for path in ("./sala-nano", "sala-nano/"):                # a path, never the preset
        code, _, err = run_cli(["run", "--model", path, "--prompt-ids", "1,2,3", "-n", 2, "--device", "cpu"], capsys)
        assert code == 3 and "mlp_bias" in err, err
    with pytest.raises(ConfigError, match="mlp_bias"):
        model_config(Path("sala-nano"))                    # Path("./sala-nano") drops the ./: a Path is a path


def test_sala_9b_next_to_a_directory_of_that_name_says_how_to_load_it(tmp_path, capsys, monkeypatch):
    shutil.copytree(EMBEDDED_DIR, tmp_path / "sala-9b")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["run", "--model", "sala-9b", "--prompt-ids", "1,2,3", "-n", 2, "--device", "cpu"], capsys)
    assert code == 4 and err.count("\n") == 1, err
    assert "preset 'sala-9b' has no embedded weights" in err and "(--model ./sala-9b loads the directory ./sala-9b " \
                                                                 "here)" in err, err
    code, _, err = run_cli(["run", "--model", "./sala-9b", "--prompt-ids", "1,2,3", "-n", 2, "--device", "cpu"],
                           capsys)
    assert code == 0, err


def test_random_weights_of_a_preset_never_take_a_directory_of_its_name_as_the_model_directory(tmp_path, monkeypatch):
    """Its tokenizer and generation_config.json would otherwise apply to the preset's random model."""
    shutil.copytree(EMBEDDED_DIR, tmp_path / "sala-9b")
    monkeypatch.chdir(tmp_path)
    assert model_dir("sala-9b", random_weights=True) is None
    assert model_config("sala-9b", random_weights=True) == sala_9b()


@pytest.fixture
def half_downloaded(tmp_path):
    """config.json and the tokenizer of a model no host has the memory for, no weight files yet."""
    d = tmp_path / "huge"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(sala_9b().replace(vocab_size=2 ** 40).to_hf_dict()))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(EMBEDDED_DIR / f, d / f)
    return d


def test_a_checkpoint_without_weight_files_is_exit_4_before_any_memory_check(half_downloaded, capsys):
    with pytest.raises(CheckpointError, match=NO_WEIGHTS):
        load_model(str(half_downloaded), "cpu", "float32")
    for cmd in (["run", "--prompt-ids", "1,2,3", "-n", 2, "--device", "cpu"], ["eval", "ppl", "--device", "cpu"],
                ["profile", "--device", "cpu"]):
        code, _, err = run_cli([*cmd, "--model", half_downloaded], capsys)
        assert code == 4 and err.count("\n") == 1 and NO_WEIGHTS in err, (cmd, err)


def test_memory_planning_from_a_config_only_directory_still_works(tmp_path, capsys):
    """report memory sizes a model from its config.json alone: no weight files are looked up there."""
    (tmp_path / "nine").mkdir()
    (tmp_path / "nine" / "config.json").write_text(json.dumps(sala_9b().to_hf_dict()))
    code, out, err = run_cli(["report", "memory", "--model", tmp_path / "nine", "--json"], capsys)
    assert code == 0 and json.loads(out)["model"] == str(tmp_path / "nine"), err


def test_quantize_takes_random_sala_9b_weights_without_reading_a_local_directory_of_that_name(tmp_path, monkeypatch):
    """quantize's source directory (tokenizer, copied files) is the loader's: a ./sala-9b next to a
    --random-weights sala-9b run is not the model's directory."""
    from salactl.quant.api import _unquantized_source
    broken_copy(tmp_path / "sala-9b")
    monkeypatch.chdir(tmp_path)
    config, source = _unquantized_source("sala-9b", "cpu", "auto", True)
    assert source is None and config == sala_9b()
    assert _unquantized_source("sala-nano", "cpu", "auto", False)[1] == EMBEDDED_DIR


def test_a_path_object_of_a_preset_name_is_the_preset_unless_that_directory_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert model_dir(Path("sala-nano")) == EMBEDDED_DIR                  # as before the bare-name rule
    assert model_config(Path("sala-9b"), random_weights=True) == sala_9b()
    broken_copy(tmp_path / "sala-nano")
    with pytest.raises(ConfigError, match="mlp_bias"):                   # the directory, not the preset
        model_config(Path("sala-nano"))


def test_a_dangling_single_file_link_is_exit_4_before_any_memory_check(half_downloaded, capsys):
    """A Hub-cache snapshot whose model.safetensors blob is missing: tensor_files reads no file there."""
    os.symlink(half_downloaded / "blob-never-downloaded", half_downloaded / "model.safetensors")
    code, _, err = run_cli(["run", "--model", str(half_downloaded), "--prompt-ids", "1,2", "-n", 1, "--device", "cpu"],
                           capsys)
    assert code == CheckpointError.exit_code and NO_WEIGHTS in err, err
