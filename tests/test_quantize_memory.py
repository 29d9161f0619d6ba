"""`salactl quantize`'s calibration memory, through the real CLI: activations that cannot fit are
refused before the weights load, and an allocation that fails anyway is one line (exit 11, what to
lower), not a traceback. Also where its time goes: the per-module times add up to the solve time."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.runtime.loader import available_host_bytes, model_config

ROOT = Path(__file__).resolve().parent.parent
# the CLI's entry point, started after `preamble` runs in the same interpreter
CLI = "import sys\n{preamble}\nfrom salactl.cli import main\nsys.argv = ['salactl', *sys.argv[1:]]\nmain()\n"


def quantize(out: Path, *args: str, preamble: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SALACTL_DEBUG"}
    return subprocess.run([sys.executable, "-c", CLI.format(preamble=preamble), "quantize", "--model", "sala-nano",
                           "--out", str(out), *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def activation_bytes_per_sample(seqlen: int) -> int:
    """Two fp32 [seqlen, hidden] layer inputs/outputs (CPU's auto dtype)."""
    return 2 * seqlen * model_config("sala-nano").hidden_size * 4


def test_calibration_activations_past_the_memory_are_refused_before_loading(tmp_path):
    avail = available_host_bytes()
    if avail is None:
        pytest.skip("available memory unknown here")
    nsamples = 2 * avail // activation_bytes_per_sample(2048) + 1
    p = quantize(tmp_path / "q", "--calib", "random", "--nsamples", str(nsamples), "--seqlen", "2048")
    assert p.returncode == 11, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--nsamples" in lines[0] and "--seqlen" in lines[0], p.stderr
    assert "quantizing" not in p.stderr and not (tmp_path / "q").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc/self/status")
def test_running_out_of_memory_while_quantizing_is_exit_11_in_one_line(tmp_path):
    """The up-front check passes (the machine has the memory), but the process may not have it: an
    address-space limit 2 GiB above what the imports took makes the first 2.1 GB activation fail."""
    avail = available_host_bytes()
    nsamples = 1000                                     # 2 x 2.1 GB of activations
    if avail is None or avail < 2 * nsamples * activation_bytes_per_sample(2048):
        pytest.skip("needs the memory the up-front check asks for")
    limit = ("import resource, torch, salactl.quant.api, salactl.runtime.host_memory as host_memory\n"
             "host_memory._address_space_available = lambda proc: None\n"   # the limit unseen by the check
             "vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024\n"
             "resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), resource.RLIM_INFINITY))")
    p = quantize(tmp_path / "q", "--calib", "random", "--nsamples", str(nsamples), "--seqlen", "2048",
                 preamble=limit)
    assert p.returncode == 11, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: quantize ran out of memory") and "--nsamples" in last, p.stderr
    assert not (tmp_path / "q").exists()


def test_module_times_add_up_to_the_solve_time(tmp_path):
    """RTN's solve is quick next to loading each weight, its error metrics and packing: those must
    count to their module, not be lost between the module times and the solve time."""
    p = quantize(tmp_path / "q", "--method", "rtn", "--calib", "random", "--nsamples", "4", "--seqlen", "256",
                 "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    modules, solve = sum(m["seconds"] for m in r["modules"]), r["seconds"]["solve"]
    assert abs(solve - modules) <= 0.03 * solve + 0.05, (modules, solve)


def test_a_failed_safetensors_mmap_counts_as_out_of_memory():
    from salactl.bench.out_of_memory import is_out_of_memory

    assert is_out_of_memory(RuntimeError("unable to mmap 208711192 bytes from file <x.safetensors>: "
                                         "Cannot allocate memory (12)"))
    assert not is_out_of_memory(RuntimeError("unable to mmap 208711192 bytes from file <x>: Permission denied (13)"))
