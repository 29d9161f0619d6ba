"""`eval` has no --random-weights, so a preset without trained weights is refused without pointing at
that flag (and its --help does not offer such a preset); a --device that names no device is a usage
error (exit 2) in every command, while a well-formed name of a device this machine lacks stays a
device error (exit 6)."""

import os
import subprocess
import sys

import pytest
import torch

from salactl.errors import DeviceError, UsageError
from salactl.runtime.loader import resolve_device
from test_bad_inputs import one_line_error


def salactl(*args, columns="200"):
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS=columns)
    env.pop("SALACTL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True, timeout=300,
                          env=env)


EVALS = {"ppl": ["eval", "ppl", "--max-tokens", "8", "--seq-len", "8"],
         "passkey": ["eval", "passkey", "--lengths", "128", "--depths", "0.5", "--trials", "1"]}


# ---------------------------------------------------------------- a preset without weights
@pytest.mark.parametrize("command", EVALS)
def test_eval_of_a_preset_without_weights_does_not_point_at_a_flag_eval_lacks(command):
    r = salactl(*EVALS[command], "--model", "sala-9b", "--device", "cpu")
    one_line_error(r.returncode, r.stderr, 4, "'sala-9b'", "trained weights", "checkpoint directory", "sala-nano")
    assert "random" not in r.stderr, r.stderr
    assert salactl(*EVALS[command], "--model", "sala-9b", "--random-weights").returncode == 2   # still no such flag


def test_run_keeps_pointing_at_random_weights_for_a_preset():
    r = salactl("run", "--model", "sala-9b", "--prompt-ids", "1", "--device", "cpu")
    one_line_error(r.returncode, r.stderr, 4, "has no embedded weights", "--random-weights")


@pytest.mark.parametrize("command", EVALS)
def test_eval_help_offers_only_models_with_weights(command):
    out = " ".join(salactl("eval", command, "--help").stdout.split())
    assert "sala-nano" in out and "sala-9b" not in out, out


# ---------------------------------------------------------------- --device that names no device
@pytest.mark.parametrize("device", ["foo", "CPU", "cuda:x", "cuda:-1", " cpu", "mps"])
def test_an_unparseable_or_unsupported_device_is_a_usage_error(device):
    with pytest.raises(UsageError, match=r"^device \(--device\) .* use auto, cpu, cuda or cuda:N$"):
        resolve_device(device)


@pytest.mark.parametrize("args", [["eval", "ppl"], ["eval", "passkey"], ["run", "--prompt-ids", "1"], ["info"]])
def test_a_misspelled_device_exits_2_in_every_command(args):
    r = salactl(*args, "--device", "foo")
    one_line_error(r.returncode, r.stderr, 2, "device (--device) 'foo' is unknown")


@pytest.mark.skipif(torch.cuda.device_count() > 7, reason="this machine has a cuda:7")
def test_a_well_formed_device_this_machine_lacks_stays_exit_6():
    with pytest.raises(DeviceError):
        resolve_device("cuda:7")
    r = salactl("eval", "ppl", "--device", "cuda:7")
    assert r.returncode == 6, r.stderr
