"""Every comma-list option of `salactl sweep` refuses an empty item ("bf16,", "2,,4") in one line
(exit 2) naming the option, as bench --phases does, instead of running the other items (names) or
failing with a traceback (--weight-dtype's memory check)."""

import pytest

from conftest import run_cli
from salactl.errors import UsageError
from salactl.lists import parse_list

TINY_SWEEP = ["--random-weights", "--device", "cpu", "--engine", "reference", "--no-kl", "--requests", "1",
              "--input-len", "8", "--output-len", "2"]      # a run of seconds, were the value not refused


def _sweep_error(tmp_path, capsys, *args, passkey: bool = False) -> str:
    code, _, err = run_cli(["sweep", *TINY_SWEEP, *([] if passkey else ["--no-passkey"]), "--out", tmp_path / "s",
                            *args], capsys)
    assert code == 2 and err.strip().count("\n") == 0, err
    assert not (tmp_path / "s" / "records.jsonl").exists()
    return err.strip()


@pytest.mark.parametrize("flag", ["--kv-cache-dtype", "--weight-dtype"])
@pytest.mark.parametrize("text", ["bf16,", "bf16,,fp32", ",bf16"])
def test_sweep_name_lists_refuse_an_empty_name(tmp_path, capsys, flag, text):
    assert _sweep_error(tmp_path, capsys, flag, text) == (
        f"error: {flag} takes comma-separated names, got {text!r}; drop the empty name")


@pytest.mark.parametrize("flag", ["--dense-len", "--topk", "--window", "--block", "--chunk-size", "--batch-size"])
def test_sweep_integer_lists_refuse_an_empty_value(tmp_path, capsys, flag):
    assert _sweep_error(tmp_path, capsys, flag, "64,,64") == (
        f"error: {flag} takes comma-separated integers, got '64,,64'; drop the empty value")


@pytest.mark.parametrize("flag, text, kind", [("--passkey-lengths", "64,", "integers"),
                                              ("--passkey-depths", "0.5,,1", "numbers")])
def test_sweep_passkey_lists_refuse_an_empty_value(tmp_path, capsys, flag, text, kind):
    assert _sweep_error(tmp_path, capsys, flag, text, passkey=True) == (
        f"error: {flag} takes comma-separated {kind}, got {text!r}; drop the empty value")


def test_a_list_of_only_commas_is_empty():
    with pytest.raises(UsageError, match="^--x is empty$"):
        parse_list(",", "--x")
    assert parse_list("bf16, fp32", "--x", str) == ["bf16", "fp32"]


def test_a_repeated_name_is_swept_once():
    from salactl.bench.sweep_grid import KV_DTYPES, WEIGHT_DTYPES, parse_names

    assert parse_names("bf16, bf16", "kv-cache-dtype", "bf16", KV_DTYPES) == ["bf16"]
    # an alias is the name it stands for, so it repeats that name too
    assert parse_names("fp8_e4m3,auto,bf16,fp8_e4m3", "kv-cache-dtype", "bf16", KV_DTYPES) == ["fp8_e4m3", "bf16"]
    assert parse_names("bfloat16,bf16", "weight-dtype", "bf16", WEIGHT_DTYPES) == ["bf16"]


@pytest.mark.parametrize("flag, valid", [("--kv-cache-dtype", "fp8_e5m2"), ("--weight-dtype", "w4a16")])
@pytest.mark.parametrize("text", [",", ""])
def test_a_name_list_of_only_commas_lists_the_valid_names(tmp_path, capsys, flag, valid, text):
    err = _sweep_error(tmp_path, capsys, flag, text)
    assert err.startswith(f"error: {flag} {text!r} is not supported; supported today: bf16, ") and valid in err, err
