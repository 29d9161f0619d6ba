"""--out of the commands that write a directory, where the file system sets limits: a name past
NAME_MAX is a usage error before any work (it was an OSError, exit 1), and `profile --out` on another
file system than its parent (a mount point, or a link to a directory elsewhere) lands there (its
files were staged beside it and failed with EXDEV after the whole run). Real CLI runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROFILE = ("profile", "--torch", "--model", "sala-nano", "--random-weights", "--context", "16", "--device", "cpu",
           "--json")


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("args", [("run", "--prompt", "hi", "--max-new-tokens", "1", "--no-op-profile"), PROFILE])
def test_a_name_past_name_max_is_a_usage_error_before_any_work(tmp_path, args):
    p = salactl(*args, "--out", tmp_path / ("d" * 256))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "256 bytes, more than the 255" in lines[0], p.stderr
    assert not list(tmp_path.iterdir())


def test_profile_takes_a_name_near_name_max(tmp_path):
    out = tmp_path / ("p" * 250)               # its staging name ".<name>.tmp-XXXXXXXX" would be 264 bytes
    p = salactl(*PROFILE, "--out", out)
    assert p.returncode == 0, p.stderr
    assert (out / "result.json").is_file() and [f.name for f in tmp_path.iterdir()] == [out.name]


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK), reason="no /dev/shm")
def test_profile_out_linked_to_another_file_system(tmp_path):
    target = Path(os.environ.get("SALACTL_TEST_SHM", "/dev/shm")) / f"salactl-test-{os.getpid()}"
    target.mkdir()
    try:
        if os.stat(target).st_dev == os.stat(tmp_path).st_dev:
            pytest.skip("/dev/shm is on the same file system as the temp dir")
        link = tmp_path / "out"
        link.symlink_to(target)
        for extra in ((), ("--overwrite",)):                    # new, then replacing the first profile
            p = salactl(*PROFILE, "--out", link, *extra)
            assert p.returncode == 0, p.stderr
            assert json.loads((target / "result.json").read_text())["elapsed_s"] == json.loads(p.stdout)["elapsed_s"]
            assert not [f.name for f in target.iterdir() if f.name.startswith(".")]      # no staging left
    finally:
        subprocess.run(["rm", "-rf", str(target)], check=True)
