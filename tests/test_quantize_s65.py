"""`salactl quantize`'s record names the model as eval's records do (its checkpoint directory as an
absolute, resolved path, wherever the record is read), and every file it writes goes through the
checkpoint's own temp dir beside --out, never TMPDIR (session 65)."""

import json
import os
import tempfile

import pytest

from conftest import run_cli
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.quant.api import quantize_checkpoint
from salactl.quant.sequential import QuantOptions
from test_quantize_cli import small_config, write_random_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("src") / "nano", small_config())


def test_a_preset_is_recorded_as_evals_records_name_it(tmp_path, capsys):
    code, out, err = run_cli(["quantize", "--model", "sala-nano", "--out", tmp_path / "q", "--method", "rtn",
                              "--device", "cpu", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["model"] == str(EMBEDDED_DIR.resolve())


def test_a_relative_directory_is_recorded_absolute_and_resolved(ckpt, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "link").symlink_to(ckpt.parent)
    here = os.getcwd()
    os.chdir(tmp_path / "run")
    try:
        code, out, err = run_cli(["quantize", "--model", f"../link/{ckpt.name}", "--out", "q", "--method", "rtn",
                                  "--device", "cpu", "--json"], capsys)
    finally:
        os.chdir(here)
    assert code == 0, err
    assert json.loads(out)["model"] == str(ckpt.resolve())


def test_the_kv_scales_json_is_staged_beside_out_not_under_tmpdir(ckpt, tmp_path, monkeypatch):
    """A TMPDIR that cannot be written (here: one that does not exist) fails nothing: the JSON is
    written into the checkpoint's temp dir beside --out, renamed into place with it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmpdir"))
    (tmp_path / "out").mkdir()
    quantize_checkpoint(ckpt, tmp_path / "out" / "q", QuantOptions(method="rtn", group_size=64, kv_cache_dtype="fp8_e4m3"),
                        calib="random", nsamples=1, seqlen=32, device="cpu")
    scales = json.loads((tmp_path / "out" / "q" / "kv_cache_scales.json").read_text())
    assert scales["kv_cache"]["dtype"] == "float8_e4m3fn"
    assert os.listdir(tmp_path / "out") == ["q"]
