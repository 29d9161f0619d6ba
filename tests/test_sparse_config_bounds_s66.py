"""Absurd `sparse_config` sizes in a checkpoint's config.json are config errors at load (exit 3, one
line naming the key, its value, the limit and the fix), not a selection that tries to allocate
terabytes (block_size 2^34 at stride 1: a 6 TB window-score buffer, reported as "ran out of memory")
or overflows a storage size with a raw RuntimeError (kernel_size 2^62); values up to 2^20 (a
1M-token context) and the thresholds dense_len / init_blocks up to 2^63 - 1 stay valid."""

import json

import pytest

from conftest import run_cli
from salactl.errors import ConfigError
from salactl.runtime.config import MAX_SPARSE_SPAN, SparseConfig
from salactl.runtime.loader import EMBEDDED_DIR

ABSURD = {
    "block_size": {"block_size": 2**34, "kernel_stride": 1, "kernel_size": 1, "window_size": 0},
    "kernel_size": {"kernel_size": 2**62},
    "topk": {"topk": 2**40},
    "window_size": {"window_size": 2**63 - 32},
}
ORIGINAL = {"block_size": 64, "kernel_size": 32, "topk": 64, "window_size": 2048}


def _message(name: str, value: int) -> str:
    return (f"sparse_config.{name} must be at most 1048576 (2^20: the sparse selection's per-query buffers grow "
            f"with it past a 1M-token context), got {value}; use the model's original value (MiniCPM-SALA's is "
            f"{ORIGINAL[name]})")


def _checkpoint(tmp_path, sparse: dict):
    """sala-nano's checkpoint (its files linked) with `sparse` over its sparse_config."""
    d = tmp_path / "ckpt"
    d.mkdir()
    for f in EMBEDDED_DIR.iterdir():
        if f.name != "config.json":
            (d / f.name).symlink_to(f)
    config = json.loads((EMBEDDED_DIR / "config.json").read_text())
    config["sparse_config"].update(sparse)
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize("name", sorted(ABSURD))
def test_an_absurd_sparse_size_is_refused_by_name(name):
    with pytest.raises(ConfigError) as e:
        SparseConfig(**ABSURD[name])
    assert str(e.value) == _message(name, ABSURD[name][name])


def test_sizes_at_the_limit_and_huge_thresholds_stay_valid():
    cap = MAX_SPARSE_SPAN
    assert cap == 2**20
    SparseConfig(block_size=cap, kernel_size=cap, kernel_stride=1, topk=cap, window_size=cap)
    SparseConfig(window_size=cap, topk=cap)            # a 1M-token window over MiniCPM-SALA's 64-token blocks
    SparseConfig(dense_len=2**63 - 1, init_blocks=2**63 - 1)   # "always dense" / every block forced
    with pytest.raises(ConfigError, match="sparse_config.block_size must be at most 1048576"):
        SparseConfig(block_size=2 * cap, kernel_stride=1, kernel_size=1, window_size=0)


@pytest.mark.parametrize("name", ["block_size", "kernel_size"])
def test_run_on_such_a_checkpoint_is_a_one_line_config_error(tmp_path, capsys, name):
    model = _checkpoint(tmp_path, ABSURD[name])
    ids = ",".join(str(3 + i % 100) for i in range(300))            # past sala-nano's dense_len 256
    code, out, err = run_cli(["run", "--model", model, "--device", "cpu", "--prompt-ids", ids,
                              "--max-new-tokens", "2", "--json", "--out", tmp_path / "runs"], capsys)
    assert (code, out) == (3, ""), err
    assert err == f"error: {_message(name, ABSURD[name][name])}\n"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["topk", "window_size"])
def test_report_memory_on_such_a_checkpoint_is_the_same_error(tmp_path, capsys, name):
    model = _checkpoint(tmp_path, ABSURD[name])
    code, out, err = run_cli(["report", "memory", "--model", model, "--context", "1000", "--json"], capsys)
    assert (code, out) == (3, ""), err
    assert err == f"error: {_message(name, ABSURD[name][name])}\n"


@pytest.mark.parametrize("option", ["topk", "window", "block"])
def test_a_sweep_value_past_the_limit_is_a_usage_error_before_loading(tmp_path, capsys, option):
    too_big = 2 * MAX_SPARSE_SPAN
    code, out, err = run_cli(["sweep", "--device", "cpu", "--engine", "reference", "--requests", "1",
                              "--input-len", "16", "--output-len", "2", "--no-kl", "--no-passkey", "--json",
                              "--out", tmp_path / "s", f"--{option}", f"64,{too_big}"], capsys)
    assert code == 2 and out == "", err
    assert err.strip() == f"error: --{option} values must be at most {MAX_SPARSE_SPAN} (2^20, sparse_config's limit), got {too_big}"
    assert not (tmp_path / "s").exists()
