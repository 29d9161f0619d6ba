"""`salactl quantize`'s calibration set, as the record reports it: a .JSONL file is JSON lines in any
case; fewer calibration tokens than the widest quantized linear's inputs (a rank-deficient Hessian,
whose GPTQ errors are in-sample fits) is warned on one line and recorded; the FP8 KV scale layout and
batch_tokens are in the record and in the checkpoint's quantization_config.meta."""

import json
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from salactl.quant.calibration import calibration_windows
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.tokenizer import find_tokenizer
from test_quantize_cli import small_config, write_random_checkpoint

# small_config's widest quantized linear: mlp.down_proj, intermediate_size 256 inputs
WIDEST = 256
QUICK = ["--device", "cpu", "--dtype", "float32", "--json"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("src") / "nano", small_config())


def test_an_upper_case_jsonl_suffix_is_read_as_json_lines(tmp_path):
    docs = ["The first calibration document.", "And a second one, somewhat longer than the first."]
    lines = "".join(json.dumps({"text": d}) + "\n" for d in docs)
    upper, lower = tmp_path / "calib.JSONL", tmp_path / "calib.jsonl"
    upper.write_text(lines)
    lower.write_text(lines)
    tok = find_tokenizer(None, EMBEDDED_DIR)
    got, want = (calibration_windows(str(p), tok, 4, 8, 4096, eos_id=2) for p in (upper, lower))
    assert torch.equal(got, want)
    assert '"text"' not in tok.decode(got.flatten().tolist())


def _quantize(ckpt, out, capsys, *args) -> tuple[dict, str, str]:
    code, stdout, err = run_cli(["quantize", "--model", ckpt, "--out", out, *map(str, args)], capsys)
    assert code == 0, err
    return (json.loads(stdout) if "--json" in args else None), stdout, err


def _in_sample_warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "in-sample" in line]


def test_fewer_tokens_than_the_widest_input_is_warned_and_recorded(ckpt, tmp_path, capsys):
    rec, _, err = _quantize(ckpt, tmp_path / "few", capsys, "--calib", "random", "--nsamples", 1,
                            "--seqlen", WIDEST - 1, *QUICK)
    warned = _in_sample_warnings(err)
    assert len(warned) == 1 and warned[0].startswith("warning: "), err
    assert f"{WIDEST - 1:,} calibration tokens" in warned[0] and f"{WIDEST:,} inputs" in warned[0]
    assert rec["calibration"]["tokens"] == WIDEST - 1
    assert rec["widest_in_features"] == WIDEST and rec["calibration_underdetermined"] is True

    _, stdout, _ = _quantize(ckpt, tmp_path / "few-table", capsys, "--calib", "random", "--nsamples", 1,
                             "--seqlen", WIDEST - 1, "--device", "cpu", "--dtype", "float32")
    assert f"(in-sample: {WIDEST - 1:,} calibration tokens < {WIDEST:,} inputs)" in stdout, stdout


def test_as_many_tokens_as_the_widest_input_is_not_warned(ckpt, tmp_path, capsys):
    rec, _, err = _quantize(ckpt, tmp_path / "enough", capsys, "--calib", "random", "--nsamples", 4,
                            "--seqlen", WIDEST // 4, *QUICK)
    assert not _in_sample_warnings(err), err
    assert rec["widest_in_features"] == WIDEST and rec["calibration_underdetermined"] is False


def _meta(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())["quantization_config"]["meta"]


def test_kv_scale_layout_and_batch_tokens_are_recorded_and_kept_in_meta(ckpt, tmp_path, capsys):
    out = tmp_path / "per-head"
    rec, _, _ = _quantize(ckpt, out, capsys, "--method", "rtn", "--calib", "random", "--nsamples", 2,
                          "--seqlen", 64, "--kv-cache-dtype", "fp8_e4m3", "--kv-scales-per-head",
                          "--batch-tokens", 64, *QUICK)
    assert rec["kv_scales_per_head"] is True and rec["batch_tokens"] == 64
    assert _meta(out)["kv_scales_per_head"] is True and _meta(out)["batch_tokens"] == 64
    assert all(len(s["k"]) == 2 for s in rec["kv_scales"].values())        # per head indeed

    out = tmp_path / "no-calibration"       # RTN reads no activations: no batch ran
    rec, _, _ = _quantize(ckpt, out, capsys, "--method", "rtn", *QUICK)
    assert rec["kv_scales_per_head"] is False and rec["batch_tokens"] is None
    assert rec["calibration"] is None and rec["calibration_underdetermined"] is None
    assert _meta(out)["kv_scales_per_head"] is False and _meta(out)["batch_tokens"] is None
