"""`salactl sweep` grid values at their edges: a value past int64 (a --dense-len meant as "dense") is
refused in one line before the model loads, not a point that fails with an OverflowError as an
endpoint error (exit 8); a repeated --passkey-depths value runs its prompts once, as eval passkey's
--depths does, so the trials counted and the point's key are those of the value given once."""

import json

import pytest

from conftest import run_cli

TINY_SWEEP = ["--device", "cpu", "--engine", "reference", "--requests", "1", "--input-len", "16",
              "--output-len", "2"]


def test_a_dense_len_past_int64_is_a_usage_error(tmp_path, capsys):
    code, out, err = run_cli(["sweep", *TINY_SWEEP, "--no-kl", "--no-passkey", "--json", "--out", tmp_path / "s",
                              "--dense-len", f"64,{2**64}"], capsys)
    assert code == 2 and out == "", err
    assert err.strip() == f"error: --dense-len values must be at most {2**63 - 1} (2^63 - 1), got {2**64}"
    assert not (tmp_path / "s").exists()


def test_the_largest_dense_len_is_swept_as_dense(tmp_path, capsys):
    code, out, err = run_cli(["sweep", *TINY_SWEEP, "--no-passkey", "--json", "--out", tmp_path / "s",
                              "--dense-len", str(2**63 - 1)], capsys)
    assert code == 0, err
    point, = json.loads(out)["points"]
    assert point["logit_kl_mean"] == 0.0 and point["kl_sparse_positions"] == 0


def test_a_repeated_passkey_depth_runs_once(tmp_path, capsys):
    def sweep(depths: str, out: str) -> dict:
        code, stdout, err = run_cli(["sweep", *TINY_SWEEP, "--no-kl", "--json", "--out", tmp_path / out,
                                     "--passkey-lengths", "64", "--passkey-trials", "1",
                                     "--passkey-depths", depths], capsys)
        assert code == 0, err
        point, = json.loads(stdout)["points"]
        return point

    once, repeated = sweep("0.5", "a"), sweep("0.5,.5,0.50", "b")
    assert [(r["depth"], r["trials"]) for r in repeated["passkey_results"]] == [(0.5, 1)]
    assert repeated["knobs"]["passkey_depths"] == [0.5]
    assert repeated["point_key"] == once["point_key"]        # --resume reuses one for the other


@pytest.mark.parametrize("name", ["dense_len", "topk", "window_size"])
def test_a_sparse_config_number_past_int64_is_a_config_error(name):
    """config.json's sparse_config is compared with int64 token positions in every request: past
    2^63 - 1 it is refused at load (exit 3), not an OverflowError at the first request."""
    from salactl.errors import ConfigError
    from salactl.runtime.config import SparseConfig

    with pytest.raises(ConfigError, match=rf"^sparse_config.{name} must be at most 9223372036854775807 \(2\^63 - 1\)"):
        SparseConfig(**{name: 2 ** 64 if name != "window_size" else 2 ** 64 * 64})
