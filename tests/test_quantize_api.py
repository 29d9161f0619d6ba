"""salactl.quant.api.quantize_checkpoint: the one Python call behind `salactl quantize` writes the
same checkpoint as the CLI, from a name or an in-memory model, and fails with the error classes
whose exit codes the CLI reports."""

import json

import pytest
import torch

from conftest import rel_err, run_cli, run_cli_ok
from salactl.errors import DatasetError, OutputExistsError, QuantizationError, UsageError
from salactl.quant.api import quantize_checkpoint
from salactl.quant.sequential import QuantOptions
from salactl.runtime.loader import load_model
from test_quantize_cli import _tensors, small_config, write_random_checkpoint

CLI_ARGS = ["--calib", "random", "--nsamples", 2, "--seqlen", 64, "--device", "cpu", "--dtype", "float32",
            "--group-size", 64, "--kv-cache-dtype", "fp8_e4m3"]
OPTS = QuantOptions(group_size=64, kv_cache_dtype="fp8_e4m3")      # the CLI's for CLI_ARGS
CALL = dict(calib="random", nsamples=2, seqlen=64, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("src") / "nano", small_config())


@pytest.fixture(scope="module")
def cli_out(ckpt, tmp_path_factory):
    """What `salactl quantize CLI_ARGS` writes."""
    out = tmp_path_factory.mktemp("cli") / "q"
    run_cli_ok("quantize", "--model", ckpt, "--out", out, *CLI_ARGS)
    return out


def _same_files(a, b):
    ta, tb = _tensors(a), _tensors(b)
    assert set(ta) == set(tb)
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and torch.equal(ta[name], tb[name]), name
    assert json.loads((a / "config.json").read_text()) == json.loads((b / "config.json").read_text())
    assert (a / "kv_cache_scales.json").read_text() == (b / "kv_cache_scales.json").read_text()


def test_one_call_from_a_path_writes_what_the_cli_writes(ckpt, cli_out, tmp_path):
    seen = []
    record = quantize_checkpoint(ckpt, tmp_path / "q", OPTS, **CALL, progress=lambda *a: seen.append(a))
    _same_files(tmp_path / "q", cli_out)
    assert record["out"] == tmp_path / "q" and record["model"] == str(ckpt)
    assert record["calibration"] == {"source": "random", "samples": 2, "seqlen": 64, "tokens": 128}
    assert len(record["modules"]) == 4 * 8 and set(record["kv_scales"]) == {"0", "3"}
    assert seen[0] == (0, 16, "quantizing") and [d for d, _, _ in seen] == list(range(17))
    assert seen[-1] == (16, 16, "layer 3: down_proj")
    lm = load_model(tmp_path / "q", "cpu", "float32")
    assert type(lm.model.model.layers[0].mlp.down_proj).__name__ == "GPTQLinear"


def test_an_in_memory_model_is_quantized_in_place_unless_copied(ckpt, cli_out, tmp_path):
    lm = load_model(ckpt, "cpu", "float32")
    weight = lm.model.model.layers[0].mlp.down_proj.weight
    before = weight.clone()
    quantize_checkpoint(lm, tmp_path / "copied", OPTS, **CALL, copy=True)
    assert torch.equal(weight, before)
    _same_files(tmp_path / "copied", cli_out)
    record = quantize_checkpoint(lm, tmp_path / "in_place", OPTS, **CALL)
    _same_files(tmp_path / "in_place", cli_out)
    assert record["model"] == lm.source
    q = load_model(tmp_path / "in_place", "cpu", "float32").model.model.layers[0].mlp.down_proj
    stored = q.dequantized_weight()[:, torch.argsort(q.perm)] if q.perm is not None else q.dequantized_weight()
    assert not torch.equal(weight, before) and rel_err(stored, weight) < 4e-3   # now the dequantized weights
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize_checkpoint(load_model(tmp_path / "in_place", "cpu", "float32"), tmp_path / "again", OPTS, **CALL)
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize("case,error,code", [
    ("exists", OutputExistsError, 10),
    ("bits", UsageError, 2),
    ("batch_tokens", UsageError, 2),
    ("empty_calib", DatasetError, 7),
])
def test_bad_input_raises_the_error_of_the_clis_exit_code(case, error, code, ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    cli = ["quantize", "--model", ckpt, "--out", out, "--calib", "random", "--device", "cpu"]
    opts, call = {}, dict(CALL)
    if case == "exists":
        out.mkdir()
    elif case == "bits":
        opts, cli = {"bits": 3}, cli + ["--bits", 3]
    elif case == "batch_tokens":
        opts, cli = {"batch_tokens": 0}, cli + ["--batch-tokens", 0]
    else:
        (tmp_path / "c.jsonl").write_text("")
        call["calib"] = cli[cli.index("random")] = tmp_path / "c.jsonl"
    assert error.exit_code == code
    assert run_cli(cli, capsys)[0] == code
    with pytest.raises(error):
        quantize_checkpoint(ckpt, out, QuantOptions(**opts), **call)
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_options_default_to_the_clis():
    """QuantOptions() is `salactl quantize`'s defaults (act-order and clip search on), and act-order,
    clip search and damping, which only change GPTQ's solve, are stored off and at the default for RTN."""
    assert QuantOptions() == QuantOptions(bits=4, group_size=128, method="gptq", desc_act=True, damp=0.01,
                                          kv_cache_dtype="bf16", kv_scales_per_head=False, batch_tokens=16384,
                                          clip_search=True)
    assert QuantOptions(method="rtn").desc_act is False and QuantOptions(method="rtn").clip_search is False
    assert QuantOptions(method="rtn", damp=0.5).damp == QuantOptions().damp       # RTN uses no damping
