"""`salactl quantize` checks that the files it copies beside the weights (README, license, the auto_map
model code and what it imports) can be read before loading anything: an unreadable one used to fail
only at the write, after the whole solve. The checkpoint's weights here are garbage, so an error
made by loading them would name them, not the unreadable file."""

import json

import pytest

from conftest import run_cli
from salactl.runtime.loader import EMBEDDED_DIR
from test_bad_inputs import unreadable_run
from test_quantize_cli import TOKENIZER_FILES, small_config

AUTO_MAP = {"AutoModelForCausalLM": "modeling_sala.SalaModel"}
FILES = {"README.md": "# model\n", "LICENSE": "Apache-2.0\n", "modeling_sala.py": "from .sala_helpers import y\n",
         "sala_helpers.py": "y = 2\n"}


def _checkpoint_with_garbage_weights(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(small_config().to_hf_dict() | {"auto_map": AUTO_MAP}))
    (path / "model.safetensors").write_bytes(b"not safetensors")
    for f in TOKENIZER_FILES:
        (path / f).write_bytes((EMBEDDED_DIR / f).read_bytes())
    for name, text in FILES.items():
        (path / name).write_text(text)
    return path


@pytest.mark.parametrize("name", list(FILES))
def test_an_unreadable_copied_file_fails_before_the_weights_load(name, tmp_path):
    src = _checkpoint_with_garbage_weights(tmp_path / "src")
    r = unreadable_run(src / name, ["quantize", "--model", src, "--out", tmp_path / "q", "--method", "rtn",
                                    "--device", "cpu"])
    assert r.returncode == 4, r.stderr
    assert r.stderr == f"error: cannot read {src / name}, to copy into the checkpoint: Permission denied; make " \
                       "it a readable file\n"
    assert not (tmp_path / "q").exists()


def test_readable_copied_files_pass_on_to_the_weights(tmp_path, capsys):
    """The premise: with every file readable, these garbage weights are what fails."""
    src = _checkpoint_with_garbage_weights(tmp_path / "src")
    code, _, err = run_cli(["quantize", "--model", src, "--out", tmp_path / "q", "--method", "rtn",
                            "--device", "cpu"], capsys)
    assert code == 4 and "cannot read" not in err and "model.safetensors" in err, err
