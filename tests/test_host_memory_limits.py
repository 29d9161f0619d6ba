"""The host memory the pre-run checks count is the least of the machine's, the memory cgroup's (a
container's limit, which /proc/meminfo does not show) and the address-space limit's (`ulimit -v`):
under a limit the checks refuse up front (exit 11, one line) what the process would otherwise die
of, e.g. inside the Rust tokenizer, which aborts (exit 134) when an allocation fails."""

import os
import subprocess
import sys

import pytest

from salactl.runtime.host_memory import available_host_bytes

MIB = 2**20


def fake_proc(tmp_path, cgroup_lines: str):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup_lines)
    (proc / "status").write_text("Name:\tpython\nVmSize:\t  1000 kB\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       64000000 kB\nMemAvailable:   32000000 kB\n")   # 32,768,000,000 bytes
    return proc, meminfo


def write(directory, **files):
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text)


def test_a_cgroup_v2_limit_counts_its_reclaimable_page_cache_and_the_tightest_ancestor_wins(tmp_path):
    proc, meminfo = fake_proc(tmp_path, "0::/user.slice/job\n")
    root = tmp_path / "cgroup"
    write(root / "user.slice" / "job", memory_max=str(1024 * MIB), memory_current=str(800 * MIB),
          memory_stat=f"anon {700 * MIB}\nfile {100 * MIB}\nshmem {20 * MIB}\n")
    assert available_host_bytes(meminfo, proc, root) == (1024 - 800 + 80) * MIB
    write(root / "user.slice", memory_max=str(2048 * MIB), memory_current=str(1900 * MIB), memory_stat="file 0\n")
    assert available_host_bytes(meminfo, proc, root) == 148 * MIB
    write(root / "user.slice", memory_max="max", memory_current=str(1900 * MIB))
    assert available_host_bytes(meminfo, proc, root) == 304 * MIB


def test_a_cgroup_v1_limit_inside_a_container_reads_the_mounted_root(tmp_path):
    """The container sees its own cgroup as the mount's root; /proc/self/cgroup names the host's path."""
    proc, meminfo = fake_proc(tmp_path, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    root = tmp_path / "cgroup"
    write(root / "memory", memory_limit_in_bytes=str(4096 * MIB), memory_usage_in_bytes=str(4000 * MIB),
          memory_stat=f"cache {300 * MIB}\ntotal_inactive_file {200 * MIB}\ntotal_active_file {56 * MIB}\n")
    assert available_host_bytes(meminfo, proc, root) == (4096 - 4000 + 256) * MIB


def test_no_cgroup_limit_leaves_the_machines_available_memory(tmp_path):
    proc, meminfo = fake_proc(tmp_path, "4:memory:/\n0::/\n")
    root = tmp_path / "cgroup"
    write(root / "memory", memory_limit_in_bytes="9223372036854771712", memory_usage_in_bytes=str(MIB))
    write(root, memory_max="max", memory_current=str(MIB))
    assert available_host_bytes(meminfo, proc, root) == 32_768_000_000
    (proc / "cgroup").write_text("garbage\n")
    assert available_host_bytes(meminfo, proc, root) == 32_768_000_000


ADDRESS_SPACE = """
import resource, sys
from salactl.runtime.host_memory import available_host_bytes
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[1]), resource.RLIM_INFINITY))
print(available_host_bytes())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_address_space_limit_bounds_the_available_memory():
    r = subprocess.run([sys.executable, "-c", ADDRESS_SPACE, str(300 * MIB)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert 250 * MIB <= int(r.stdout) <= 300 * MIB


# the runtime modules load first; then `ulimit -v` leaves argv[1] more bytes of address space
LIMITED = """
import resource, sys
import salactl.cli, salactl.cmd_eval, salactl.cmd_run, salactl.run_job, salactl.runtime.engine, tokenizers, torch
extra = int(sys.argv.pop(1))
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + extra, resource.RLIM_INFINITY))
sys.argv = ["salactl", *sys.argv[1:]]
salactl.cli.main()
"""


def limited(extra: int, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}       # no per-core thread stacks inside the limit
    return subprocess.run([sys.executable, "-c", LIMITED, str(extra), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)


def refusal(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 11 and r.stdout == "" and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_prefill_past_the_address_space_limit_is_refused_before_it_runs():
    r = limited(600_000_000, "run", "--prompt-ids", ",".join(["5"] * 16384), "--chunk-size", 16384, "-n", 2,
                "--device", "cpu")
    line = refusal(r)
    assert line.startswith("error: run (the prompt's prefill, 16,384 tokens at --chunk-size 16,384"), line
    assert "but this machine has " in line and "MiB available; use --chunk-size " in line, line


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_text_the_tokenizer_could_not_hold_under_the_limit_is_refused_not_aborted(tmp_path):
    """120 MiB of address space past the imports: tokenizing 8 MB of digits aborted the process
    inside the Rust tokenizer (exit 134); the --file read cap now counts the limit."""
    text = tmp_path / "digits.txt"
    text.write_text("1234567890 " * 727_273)
    r = limited(120 * MIB, "eval", "ppl", "--file", text, "--max-tokens", "0", "--device", "cpu")
    line = refusal(r)
    assert line.startswith(f"error: --file {text} holds more than "), line
