"""Option values that can never work are one-line usage errors (exit 2) before any model loads: a
sweep --window / --block that no grid combination makes valid, empty --backend / --slo /
--reference values, empty --phases / --layers items, and an unknown --dtype next to --weights."""

import pytest

from conftest import run_cli
from salactl.bench.job import BenchSettings, run_bench
from salactl.bench.metrics import parse_slo
from salactl.bench.scoring import parse_reference
from salactl.bench.sweep_grid import check_window_and_block
from salactl.cmd_bench import phase_names
from salactl.errors import UsageError
from salactl.profiling.spec import ProfileSpec, parse_layers
from salactl.runtime.presets import sala_nano

NANO = sala_nano().sparse_config          # block_size 32, window_size 64, kernel_stride 8
TINY_BENCH = ["--profile", "decode", "--scale", "0.01", "--random-weights", "--device", "cpu", "--engine",
              "reference"]     # with --phases decode-bs1: a run of 3 s, were the option's value not refused
TINY_SWEEP = ["--no-kl", "--no-passkey", "--requests", "1", "--input-len", "8", "--output-len", "2"]


def _one_line_usage_error(code: int, err: str) -> str:
    assert code == 2 and err.strip().count("\n") == 0, err
    return err.strip()


@pytest.mark.parametrize("args, message", [
    (["--window", "3"], "--window 3 is not a multiple of the block size 32; use a multiple of 32"),
    (["--block", "7"], "--block 7 is not a multiple of the model's kernel_stride 8; use a multiple of 8"),
    (["--block", "7,32"], "--block 7 is not a multiple of the model's kernel_stride 8; use a multiple of 8"),
    (["--block", "48"], "--block 48 does not divide the model's window_size 64 (the window is whole blocks); "
                        "use a divisor of 64, or add --window with a multiple of 48"),
    (["--window", "3", "--block", "32,64"],
     "--window 3 is not a multiple of any --block value (32, 64); use a multiple of one of them"),
    (["--window", "64", "--block", "32,128"],
     "--block 128 divides no --window value (64); use a block size that divides one"),
])
def test_sweep_window_or_block_invalid_with_every_combination_is_refused_before_loading(
        tmp_path, capsys, args, message):
    out = tmp_path / "sw"
    code, _, err = run_cli(["sweep", "--device", "cpu", *args, *TINY_SWEEP, "--out", out], capsys)
    assert _one_line_usage_error(code, err) == f"error: {message}"
    assert not out.exists()


@pytest.mark.parametrize("window, block", [("32,48", "16,32"), ("0", None), (None, "16"), (None, None)])
def test_a_grid_with_some_valid_window_block_combination_per_value_passes_the_check(window, block):
    check_window_and_block(window, block, NANO)       # its invalid points are skipped after loading


@pytest.mark.parametrize("args, flag", [
    (["--backend", "", *TINY_BENCH, "--phases", "decode-bs1"], "--backend"),
    (["--backend", "", "--endpoint", "http://127.0.0.1:9"], "--backend"),
    (["--slo", "", *TINY_BENCH, "--phases", "decode-bs1"], "--slo"),
    (["--reference", "", *TINY_BENCH, "--phases", "decode-bs1"], "--reference"),
])
def test_bench_empty_values_are_usage_errors(tmp_path, capsys, args, flag):
    code, _, err = run_cli(["bench", *args, "--out", tmp_path / "b"], capsys)
    assert _one_line_usage_error(code, err).startswith(f"error: {flag} is empty; give ")


def test_bench_settings_empty_backend_without_endpoint_is_refused(tmp_path):
    s = BenchSettings(profile="decode", phases=("decode-bs1",), scale=0.01, random_weights=True,
                      device="cpu", engine="reference", backend="", out=tmp_path / "b")
    with pytest.raises(UsageError, match="^--backend needs --endpoint URL"):
        run_bench(s)
    assert not (tmp_path / "b").exists()


def test_bench_settings_empty_backend_with_endpoint_is_not_read_as_sglang(tmp_path):
    s = BenchSettings(endpoint="http://127.0.0.1:9", backend="", out=tmp_path / "b")
    with pytest.raises(UsageError, match="^--backend must be one of .*, got ''$"):
        run_bench(s)


@pytest.mark.parametrize("parse, flag", [(parse_slo, "--slo"), (parse_reference, "--reference")])
def test_empty_pairs_are_refused_and_none_is_unset(parse, flag):
    with pytest.raises(UsageError, match=f"^{flag} is empty; give pairs such as "):
        parse(" ")
    assert parse(None) == {}


@pytest.mark.parametrize("text", ["decode-bs1,", "decode-bs1,,decode-bs8", ",decode-bs1"])
def test_bench_phases_with_an_empty_name_are_refused(tmp_path, capsys, text):
    code, _, err = run_cli(["bench", *TINY_BENCH, "--phases", text, "--out", tmp_path / "b"], capsys)
    assert _one_line_usage_error(code, err) == (f"error: --phases takes comma-separated phase names, got "
                                                f"{text!r}; drop the empty name")
    assert phase_names("S1, S8") == ("S1", "S8")


@pytest.mark.parametrize("text", ["1,,2", "1,", ",lm_head", ","])
def test_profile_layers_with_an_empty_item_are_refused(tmp_path, capsys, text):
    code, _, err = run_cli(["profile", "--torch", "--layers", text, "--out", tmp_path / "p"], capsys)
    assert _one_line_usage_error(code, err) == (f"error: --layers takes layer indices and optionally lm_head, "
                                                f"e.g. 1,9,lm_head; got {text!r}")
    assert parse_layers(" 2, 1,lm_head") == ((1, 2), True) and parse_layers("lm_head") == ((), True)
    with pytest.raises(UsageError, match="^--layers is empty$"):
        parse_layers(" ")


def test_profile_unknown_dtype_with_weights_gets_the_unknown_dtype_error(tmp_path, capsys):
    code, _, err = run_cli(["profile", "--weights", "bf16", "--dtype", "bogus", "--out", tmp_path / "p"], capsys)
    assert _one_line_usage_error(code, err).startswith("error: dtype (--dtype) 'bogus' is unknown; valid: auto, ")
    with pytest.raises(UsageError, match="but --dtype is fp16; drop --dtype or --weights"):
        ProfileSpec(weights="bf16", dtype="fp16")
    assert ProfileSpec(weights="bf16", dtype="bfloat16").dtype == "bfloat16"
