"""A checkpoint file that is there but cannot be read (no permission, a dangling symlink such as a
cleaned HF-cache blob, a symlink loop, a directory or FIFO in its place), and a --model or
--tokenizer path that cannot be looked up, are one-line errors with the checkpoint's (4) or the
tokenizer's (5) exit code naming the file: never "no such file", exit 1, or an optional file
silently taken for absent."""

import os
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from salactl.runtime.loader import EMBEDDED_DIR
from test_bad_inputs import one_line_error, unreadable_run

SHARD = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"


@pytest.fixture
def nano(tmp_path) -> Path:
    return Path(shutil.copytree(EMBEDDED_DIR, tmp_path / "nano"))


def run_args(model, *extra):
    return ["run", "--model", model, "--prompt", "hi", "-n", "1", "--no-op-profile", *extra]


# ---------------------------------------------------------------- no permission (chmod 000)
@pytest.mark.parametrize("name", [SHARD, INDEX, "generation_config.json"])
def test_an_unreadable_checkpoint_file_says_permission_denied(nano, name):
    r = unreadable_run(nano / name, run_args(nano))
    one_line_error(r.returncode, r.stderr, 4, f"cannot read {nano / name}", "Permission denied",
                   "fix its permissions")
    assert "No such file" not in r.stderr and "SALACTL_DEBUG" not in r.stderr


def test_an_unreadable_tokenizer_config_is_not_taken_for_a_missing_chat_template(nano):
    r = unreadable_run(nano / "tokenizer_config.json", run_args(nano, "--chat"))
    one_line_error(r.returncode, r.stderr, 5, f"cannot read {nano / 'tokenizer_config.json'}",
                   "Permission denied")
    assert "no chat template" not in r.stderr


@pytest.mark.parametrize("flag, code", [("--model", 4), ("--tokenizer", 5)])
def test_a_path_below_a_directory_without_search_permission_names_it(tmp_path, flag, code):
    locked = tmp_path / "locked"
    inner = Path(shutil.copytree(EMBEDDED_DIR, locked / "nano"))
    args = run_args(inner) if flag == "--model" else run_args("sala-nano", "--tokenizer", inner)
    try:
        r = unreadable_run(locked, args)
    finally:
        locked.chmod(0o755)
    one_line_error(r.returncode, r.stderr, code, "cannot look up", str(inner), "Permission denied")


@pytest.mark.parametrize("flag, code", [("--model", 4), ("--tokenizer", 5)])
def test_a_path_name_too_long_for_the_filesystem_is_a_one_line_error(flag, code, capsys):
    name = "m" * 300
    args = run_args(name) if flag == "--model" else run_args("sala-nano", "--tokenizer", name)
    code_, _, err = run_cli(args, capsys)
    one_line_error(code_, err, code, "cannot look up", "File name too long")


# ---------------------------------------------------------------- there, but not a readable file
def dangling(path: Path):
    path.unlink()
    path.symlink_to(path.parent / "cleaned-blob")


def loop(path: Path):
    path.unlink()
    path.symlink_to(path.name)


def directory(path: Path):
    path.unlink()
    path.mkdir()


def fifo(path: Path):
    path.unlink()
    os.mkfifo(path)


BREAKAGES = {"dangling symlink": (dangling, "a symlink to"), "symlink loop": (loop, "symbolic links"),
             "directory": (directory, "not a regular file"), "fifo": (fifo, "not a regular file")}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_generation_config_is_not_silently_greedy(nano, capsys, breakage):
    make, why = BREAKAGES[breakage]
    make(nano / "generation_config.json")
    code, out, err = run_cli(run_args(nano), capsys)
    one_line_error(code, err, 4, str(nano / "generation_config.json"), why)


@pytest.mark.parametrize("breakage", ["dangling symlink", "symlink loop"])
def test_a_broken_tokenizer_config_is_not_taken_for_absent(nano, capsys, breakage):
    make, why = BREAKAGES[breakage]
    make(nano / "tokenizer_config.json")
    code, out, err = run_cli(run_args(nano, "--chat"), capsys)
    one_line_error(code, err, 5, str(nano / "tokenizer_config.json"), why, "fix or remove it")
    assert "no chat template" not in err


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_shard_that_cannot_be_opened_is_not_called_missing(nano, capsys, breakage):
    make, why = BREAKAGES[breakage]
    make(nano / SHARD)
    code, out, err = run_cli(run_args(nano), capsys)
    one_line_error(code, err, 4, str(nano / SHARD), why)
    assert "named in" not in err         # the message for a shard that is not there


def test_an_index_that_is_a_symlink_loop_is_not_called_missing(nano, capsys):
    loop(nano / INDEX)
    code, out, err = run_cli(run_args(nano), capsys)
    one_line_error(code, err, 4, f"cannot read {nano / INDEX}", "symbolic links")
    assert "has neither" not in err


def test_a_dangling_quantize_config_is_not_taken_for_a_full_precision_checkpoint(nano, capsys):
    (nano / "quantize_config.json").symlink_to(nano / "cleaned-blob")
    code, out, err = run_cli(run_args(nano), capsys)
    one_line_error(code, err, 4, str(nano / "quantize_config.json"), "a symlink to")
