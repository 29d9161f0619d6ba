"""`salactl quantize` records everything else that changes its result, in the --json record and in the
checkpoint's quantization_config.meta alike: --seed, --dtype (resolved), --nsamples/--seqlen as asked
and the calibration the data gave (source, samples, seqlen, tokens); each null where it cannot change
the result."""

import json
from pathlib import Path

import pytest

from conftest import run_cli
from salactl.quant.api import quantize_checkpoint
from salactl.quant.sequential import QuantOptions
from salactl.runtime.loader import load_model
from test_quantize_cli import small_config, write_random_checkpoint

KEYS = ("seed", "dtype", "nsamples", "seqlen", "calibration", "batch_tokens", "kv_scales_per_head")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("src") / "nano", small_config())


def _meta(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())["quantization_config"]["meta"]


def _quantize(out: Path, capsys, *args) -> dict:
    """The record's KEYS, checked to be the same in the checkpoint's meta."""
    code, stdout, err = run_cli(["quantize", "--out", out, "--device", "cpu", "--json", *map(str, args)], capsys)
    assert code == 0, err
    rec = {k: json.loads(stdout)[k] for k in KEYS}
    assert {k: _meta(out)[k] for k in KEYS} == rec
    return rec


def test_gptq_records_its_seed_dtype_and_calibration(ckpt, tmp_path, capsys):
    rec = _quantize(tmp_path / "q", capsys, "--model", ckpt, "--calib", "random", "--seed", 3, "--dtype", "bfloat16",
                    "--nsamples", 2, "--seqlen", 64, "--batch-tokens", 64)
    assert rec == {"seed": 3, "dtype": "bfloat16", "nsamples": 2, "seqlen": 64, "batch_tokens": 64,
                   "kv_scales_per_head": False,
                   "calibration": {"source": "random", "samples": 2, "seqlen": 64, "tokens": 128}}


def test_auto_dtype_is_recorded_as_resolved(ckpt, tmp_path, capsys):
    rec = _quantize(tmp_path / "q", capsys, "--model", ckpt, "--method", "rtn", "--calib", "random",
                    "--nsamples", 1, "--seqlen", 16)
    assert rec["dtype"] == "float32" and rec["seed"] == 0          # auto on CPU; the default seed


def test_nsamples_and_seqlen_are_as_asked_and_calibration_what_the_text_gave(ckpt, tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("A short calibration text, enough for a few windows of eight tokens and no more. " * 3)
    rec = _quantize(tmp_path / "q", capsys, "--model", ckpt, "--method", "rtn", "--calib", text,
                    "--nsamples", 1000, "--seqlen", 8)
    assert rec["nsamples"] == 1000 and rec["seqlen"] == 8
    c = rec["calibration"]
    assert c["source"] == str(text) and 1 <= c["samples"] < 1000 and c["seqlen"] == 8
    assert c["tokens"] == c["samples"] * 8


def test_without_calibration_only_what_changes_the_result_is_recorded(ckpt, tmp_path, capsys):
    # stored weights, no forward: neither --seed nor --dtype can change the checkpoint
    rec = _quantize(tmp_path / "stored", capsys, "--model", ckpt, "--method", "rtn", "--dtype", "bfloat16")
    assert rec == {"seed": None, "dtype": None, "nsamples": None, "seqlen": None, "calibration": None,
                   "batch_tokens": None, "kv_scales_per_head": False}
    # random weights are drawn with the seed, in the dtype, and quantized from memory
    rec = _quantize(tmp_path / "random", capsys, "--random-weights", "--seed", 5, "--dtype", "bfloat16",
                    "--method", "rtn")
    assert rec["seed"] == 5 and rec["dtype"] == "bfloat16" and rec["calibration"] is None


def test_a_loaded_model_records_the_dtype_it_is_quantized_from(ckpt, tmp_path):
    lm = load_model(ckpt, "cpu", "bfloat16")
    rec = quantize_checkpoint(lm, tmp_path / "q", QuantOptions(method="rtn"))
    assert rec["dtype"] == "bfloat16" and rec["seed"] is None
    assert _meta(tmp_path / "q")["dtype"] == "bfloat16"


def test_gptq_without_calib_records_the_built_in_corpus_as_its_source(tmp_path, capsys):
    rec = _quantize(tmp_path / "q", capsys, "--model", "sala-nano", "--nsamples", 1, "--seqlen", 16)
    assert rec["calibration"] == {"source": "builtin-corpus", "samples": 1, "seqlen": 16, "tokens": 16}
