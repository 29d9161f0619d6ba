"""`salactl sweep` input that cannot be honoured is refused before the model loads: passkey prompts
past the host's memory (exit 11, as `eval passkey --trials`), and a --tokenizer that neither the KL
nor the passkey test would use (exit 2, as bench refuses ignored options)."""

import json
import os
import subprocess
import sys
import time

import pytest

from salactl.runtime.loader import EMBEDDED_DIR

SPEED = ("--device", "cpu", "--input-len", "8", "--output-len", "2", "--requests", "1")


def salactl(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.mark.parametrize("extra", [
    ("--passkey-trials", 100_000_000),
    ("--passkey-trials", 99999999999999999999999),
    ("--passkey-trials", 10_000_000, "--passkey-depths", ",".join(["0.5"] * 50)),
])
def test_passkey_prompts_past_host_memory_are_refused_before_any_is_built(tmp_path, extra):
    out = tmp_path / "o"
    t = time.perf_counter()
    r = salactl("sweep", *SPEED, *extra, "--out", out, timeout=120)
    took = time.perf_counter() - t
    assert r.returncode == 11, r.stderr
    line = r.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("error: the passkey test (") and "--passkey-trials" in line, line
    assert line.endswith("; lower --passkey-trials, fewer or shorter --passkey-lengths or fewer --passkey-depths, "
                         "or pass --no-passkey"), line
    assert took < 60 and not out.exists()


def test_a_tokenizer_neither_proxy_uses_is_refused(tmp_path):
    out = tmp_path / "o"
    r = salactl("sweep", *SPEED, "--tokenizer", EMBEDDED_DIR, "--no-kl", "--no-passkey", "--out", out, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("error: --tokenizer applies to the KL and passkey prompts, which --no-kl and "
                                "--no-passkey skip; drop it, or drop --no-kl or --no-passkey")
    assert not out.exists()


def test_a_tokenizer_for_the_passkey_test_and_a_small_passkey_run_are_accepted(tmp_path):
    r = salactl("sweep", *SPEED, "--tokenizer", EMBEDDED_DIR, "--no-kl", "--passkey-lengths", "100",
                "--passkey-depths", "0.5", "--passkey-trials", "1", "--out", tmp_path / "o", "--json")
    assert r.returncode == 0, r.stderr
    point = json.loads(r.stdout)["points"][0]
    assert [(x["length"], x["trials"]) for x in point["passkey_results"]] == [(100, 1)]
    assert point["knobs"]["tokenizer"] == str((EMBEDDED_DIR / "tokenizer.json").resolve())
