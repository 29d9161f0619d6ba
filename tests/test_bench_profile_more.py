"""Profile keys that used to be silently ignored or to crash bench: a negative seed, lengths in a
kind = "soar" profile, request counts and rates in a one-batch profile; --profile files that are no
regular file; --scale whose lengths overflow a float; --dataset with a one-batch profile refused
before the file is read."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.bench.profiles import load_profile
from salactl.errors import ConfigError
from salactl.options import SEED_MAX


def salactl(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def one_line(r, code, *words):
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert all(w in r.stderr for w in words), r.stderr


def profile(tmp_path, body: str) -> str:
    p = tmp_path / "p.toml"
    p.write_text(body)
    return str(p)


@pytest.mark.parametrize("seed", [-1, SEED_MAX + 1])
def test_a_seed_outside_the_range_of_seed_is_a_config_error(tmp_path, seed):
    path = profile(tmp_path, f'seed = {seed}\n[[phases]]\nname = "p"\nnum_requests = 2\n')
    with pytest.raises(ConfigError, match=rf"p.toml: seed must be a non-negative integer of at most {SEED_MAX} "
                                          rf"\(as --seed\), got {seed}"):
        load_profile(path)
    assert load_profile(profile(tmp_path, f'seed = {SEED_MAX}\n[[phases]]\nname = "p"\n')).seed == SEED_MAX


def test_a_negative_seed_is_exit_3_not_a_numpy_traceback(tmp_path):
    path = profile(tmp_path, 'seed = -1\n[[phases]]\nname = "p"\nnum_requests = 2\n')
    r = salactl("bench", "--profile", path, "--model", "sala-nano", "--random-weights", "--device", "cpu",
                "--scale", "0.001", "--out", str(tmp_path / "o"))
    one_line(r, 3, "seed must be a non-negative integer")


@pytest.mark.parametrize("table, key, value", [
    ("dataset", "input_len", "8"), ("dataset", "output_len", "4"), ("dataset", "range_ratio", "0.5"),
    ("phases", "input_len", "[16, 64]"), ("phases", "output_len", "3"), ("phases", "range_ratio", "0.1"),
])
def test_lengths_in_a_soar_kind_profile_are_refused(tmp_path, table, key, value):
    ds = f"{key} = {value}\n" if table == "dataset" else ""
    ph = f"{key} = {value}\n" if table == "phases" else ""
    path = profile(tmp_path, f'[dataset]\nkind = "soar"\n{ds}[[phases]]\nname = "p"\nnum_requests = 2\n{ph}')
    where = re.escape(f"dataset.{key}" if table == "dataset" else f"phases[0].{key}")
    with pytest.raises(ConfigError, match=rf"p.toml: {where} is ignored with kind = \"soar\" .*drop it, or use "
                                          r'kind = "random"'):
        load_profile(path)


@pytest.mark.parametrize("table, key, value", [
    ("phases", "num_requests", "7"), ("phases", "max_concurrency", "3"), ("phases", "request_rate", "2"),
    ("phases", "burstiness", "0.5"), ("dataset", "num_requests", "50"),
])
def test_counts_and_rates_in_a_one_batch_profile_are_refused(tmp_path, table, key, value):
    ds = f"{key} = {value}\n" if table == "dataset" else ""
    ph = f"{key} = {value}\n" if table == "phases" else ""
    path = profile(tmp_path, f'mode = "one-batch"\n[dataset]\nkind = "random"\n{ds}[[phases]]\nname = "b"\n'
                             f"batch_size = 1\ninput_len = 8\noutput_len = 4\n{ph}")
    where = re.escape(f"dataset.{key}" if table == "dataset" else f"phases[0].{key}")
    with pytest.raises(ConfigError, match=rf"p.toml: {where} is set by batch_size in a one-batch profile"):
        load_profile(path)


def test_shipped_profiles_still_load():
    for name in ("soar", "decode", "prefill", "long-context", "serving"):
        assert load_profile(name).phases


@pytest.mark.parametrize("which", ["dev-zero", "fifo"])
def test_a_profile_that_is_no_regular_file_is_refused_at_once(tmp_path, which):
    path = Path("/dev/zero") if which == "dev-zero" else tmp_path / "p.toml"
    if which == "fifo":
        os.mkfifo(path)
    if not path.exists():
        pytest.skip("no /dev/zero here")
    r = salactl("bench", "--profile", str(path), "--out", str(tmp_path / "o"), timeout=60)
    one_line(r, 3, f"--profile {path} is not a regular file; give a .toml file")


def test_an_oversized_profile_is_refused_before_reading(tmp_path):
    p = tmp_path / "big.toml"
    with open(p, "wb") as f:
        f.truncate(2**20 + 1)
    with pytest.raises(ConfigError, match=r"big.toml is 1,048,577 bytes, over the 1 MiB a profile may have"):
        load_profile(str(p))


def test_a_one_batch_profile_refuses_dataset_before_reading_it(tmp_path):
    """/dev/zero would be refused as a file (exit 7) were it opened: the profile's refusal comes first."""
    r = salactl("bench", "--profile", "decode", "--dataset", "/dev/zero", "--out", str(tmp_path / "o"), timeout=60)
    one_line(r, 2, "profile decode is a one-batch grid of random prompts; it takes no --dataset")


@pytest.mark.parametrize("name", ["soar", "decode", "prefill", "serving", "long-context"])
def test_a_scale_that_overflows_the_lengths_is_a_capacity_error(tmp_path, name):
    """As 1e300 already was (the prompts cannot fit): 1e308 made the lengths inf, and round() raised."""
    r = salactl("bench", "--profile", name, "--model", "sala-nano", "--random-weights", "--device", "cpu",
                "--scale", "1e308", "--out", str(tmp_path / "o"))
    one_line(r, 11, "--scale 1e+308 scales a length of", "tokens to inf, past any machine's memory; lower --scale")
