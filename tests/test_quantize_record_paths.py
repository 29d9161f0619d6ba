"""`salactl quantize` records the --calib file and the --tokenizer it was given as absolute, resolved
paths (in the --json record and the checkpoint's quantization_config.meta alike), so the record
names them wherever it is read; "random" stays as is, and tokenizer is null for the model's own."""

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from salactl.errors import UsageError
from salactl.quant.api import quantize_checkpoint
from salactl.runtime.loader import EMBEDDED_DIR
from test_quantize_cli import small_config, write_random_checkpoint

QUICK_RTN = ["--method", "rtn", "--nsamples", "1", "--seqlen", "8", "--device", "cpu", "--json"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("src") / "nano", small_config())


def _quantize_in(cwd: Path, capsys, *args) -> tuple[dict, dict]:
    """(the --json record, the checkpoint's meta) of `salactl quantize ARGS` run in `cwd`."""
    here = os.getcwd()
    os.chdir(cwd)
    try:
        code, out, err = run_cli(["quantize", "--out", "q", *QUICK_RTN, *map(str, args)], capsys)
    finally:
        os.chdir(here)
    assert code == 0, err
    meta = json.loads((cwd / "q" / "config.json").read_text())["quantization_config"]["meta"]
    return json.loads(out), meta


def test_calib_and_tokenizer_are_recorded_as_absolute_resolved_paths(ckpt, tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "calib.txt").write_text("Calibration text, long enough for one window of eight tokens.")
    (tmp_path / "tok").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(EMBEDDED_DIR / name, tmp_path / "tok")
    (tmp_path / "run").mkdir()
    rec, meta = _quantize_in(tmp_path / "run", capsys, "--model", ckpt, "--calib", "../data/calib.txt",
                             "--tokenizer", "../tok")
    assert rec["calibration"]["source"] == str((tmp_path / "data" / "calib.txt").resolve())
    assert rec["tokenizer"] == str((tmp_path / "tok" / "tokenizer.json").resolve())
    assert meta["calibration"] == rec["calibration"] and meta["tokenizer"] == rec["tokenizer"]


def test_random_calib_stays_random_and_the_models_own_tokenizer_is_null(ckpt, tmp_path, capsys):
    rec, meta = _quantize_in(tmp_path, capsys, "--model", ckpt, "--calib", "random")
    assert rec["calibration"]["source"] == "random" and rec["tokenizer"] is None and meta["tokenizer"] is None
    (tmp_path / "calib.txt").write_text("Calibration text, long enough for one window of eight tokens.")
    shutil.rmtree(tmp_path / "q")
    rec, _ = _quantize_in(tmp_path, capsys, "--model", ckpt, "--calib", "calib.txt")
    assert rec["calibration"]["source"] == str((tmp_path / "calib.txt").resolve()) and rec["tokenizer"] is None


@pytest.mark.parametrize("tokenizer", ["", " "])
def test_an_empty_tokenizer_is_refused_not_taken_as_the_models_own(ckpt, tmp_path, tokenizer):
    with pytest.raises(UsageError, match=r"^tokenizer \(--tokenizer\) is empty; "):
        quantize_checkpoint(ckpt, tmp_path / "q", tokenizer=tokenizer)
    assert not (tmp_path / "q").exists()
