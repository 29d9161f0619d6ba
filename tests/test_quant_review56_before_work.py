"""`salactl quantize` refuses, before any work: --calib random windows whose activations cannot fit
(exit 11, one line, before a single token id is drawn), and a file it would copy beside the weights
that is a symlink to a missing target (exit 4, naming the link), which used to be left out unnoticed.
A symlink to a file that exists (a Hub cache's layout) is copied as the file."""

import json
import os
import shutil

import pytest

from conftest import run_cli
from salactl.runtime.loader import available_host_bytes
from test_quantize_copy_checks import AUTO_MAP, FILES
from test_quantize_cli import small_config, write_random_checkpoint

RTN = ["--method", "rtn", "--device", "cpu"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A loadable checkpoint with every kind of copied file: tokenizer, README, LICENSE, auto_map code
    and a module it imports."""
    path = write_random_checkpoint(tmp_path_factory.mktemp("src") / "nano", small_config())
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"auto_map": AUTO_MAP}))
    for name, text in FILES.items():
        (path / name).write_text(text)
    return path


def test_random_calibration_past_the_memory_is_refused_before_its_ids_are_drawn(tmp_path, capsys):
    if available_host_bytes() is None:
        pytest.skip("available memory unknown here")
    # 2 x 10^12 x 2048 token ids alone would be 16 PB
    code, out, err = run_cli(["quantize", "--out", tmp_path / "q", "--device", "cpu", "--calib", "random",
                              "--nsamples", 10**12, "--seqlen", 2048], capsys)
    assert code == 11, err
    assert err.startswith("error: quantize (the calibration activations, 2 x 1,000,000,000,000 samples x 2,048 "
                          "tokens") and err.count("\n") == 1, err
    assert "--nsamples" in err and out == "" and not (tmp_path / "q").exists()


@pytest.mark.parametrize("name", ["tokenizer_config.json", *FILES])
def test_a_copied_file_linked_to_a_missing_target_is_refused_before_any_work(name, ckpt, tmp_path, capsys):
    src = shutil.copytree(ckpt, tmp_path / "src")
    (src / name).unlink()
    (src / name).symlink_to("../blobs/gone")
    code, _, err = run_cli(["quantize", "--model", src, "--out", tmp_path / "q", *RTN], capsys)
    assert code == 4, err
    assert err == (f"error: {src / name} is a symlink to ../blobs/gone, which does not exist, so it cannot be "
                   "copied into the checkpoint; restore its target (download it again) or remove the link\n")
    assert not (tmp_path / "q").exists()


def test_copied_files_linked_to_existing_targets_are_copied_as_files(tmp_path, capsys):
    """A Hub cache snapshot: every file a relative symlink into blobs/."""
    real = write_random_checkpoint(tmp_path / "real", small_config())
    (real / "LICENSE").write_text("Apache-2.0\n")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    for f in real.iterdir():
        (snapshot / f.name).symlink_to(os.path.relpath(f, snapshot))
    code, _, err = run_cli(["quantize", "--model", snapshot, "--out", tmp_path / "q", *RTN], capsys)
    assert code == 0, err
    copied = tmp_path / "q" / "LICENSE"
    assert not copied.is_symlink() and copied.read_text() == "Apache-2.0\n"
    assert (tmp_path / "q" / "tokenizer.json").read_bytes() == (real / "tokenizer.json").read_bytes()
