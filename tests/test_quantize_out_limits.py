"""`salactl quantize --out` at the edges of what the file system allows, through the real CLI: a
name near NAME_MAX (the temp and backup names beside it must still fit), one past it (a usage error
before any work), and an --out that is a mount point (a Docker volume), which cannot be renamed:
refused before any work, pointing at a directory inside it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.runtime.checkpoint_write import is_mount_point
from salactl.runtime.loader import load_model

ROOT = Path(__file__).resolve().parent.parent


def quantize(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SALACTL_DEBUG"}
    return subprocess.run([sys.executable, "-m", "salactl", "quantize", "--model", "sala-nano", "--method", "rtn",
                           "--out", str(out), *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_a_name_just_under_name_max_is_written(tmp_path):
    out = tmp_path / ("q" * 250)            # its temp dir ".<name>.tmp-<pid>-<8>" would be 272 bytes
    p = quantize(out)
    assert p.returncode == 0, p.stderr
    load_model(str(out), "cpu", "auto")
    assert [d.name for d in tmp_path.iterdir()] == [out.name]          # no temp or backup dir left
    p = quantize(out, "--overwrite", "--bits", "8")                     # the backup name fits too
    assert p.returncode == 0, p.stderr
    assert '"bits": 8' in (out / "config.json").read_text()
    assert [d.name for d in tmp_path.iterdir()] == [out.name]


def test_a_name_past_name_max_is_a_usage_error_before_any_work(tmp_path):
    p = quantize(tmp_path / ("q" * 256))
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "256 bytes, more than the 255" in lines[0] and "quantizing" not in p.stderr, p.stderr
    assert not list(tmp_path.iterdir())


@pytest.fixture
def mount(tmpfs):
    """Room for sala-nano's 4-bit checkpoint (8 MB)."""
    return tmpfs("12m")


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_mount_point_is_refused_before_any_work_and_a_directory_inside_it_is_written(mount, overwrite):
    p = quantize(mount, *overwrite)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "is a mount point" in lines[0], p.stderr
    assert f"--out {mount / 'model'}" in lines[0] and "quantizing" not in p.stderr
    assert not list(mount.iterdir())
    p = quantize(mount / "model")
    assert p.returncode == 0, p.stderr
    load_model(str(mount / "model"), "cpu", "auto")
    assert [f.name for f in mount.iterdir()] == ["model"]          # no temp or backup dir left


def test_a_bind_mount_of_the_same_file_system_is_a_mount_point(tmp_path):
    """os.path.ismount misses it (same device, a different inode than its parent); renaming it is EBUSY all the same."""
    src, dst = tmp_path / "src", tmp_path / "a dir"      # mountinfo escapes the space
    src.mkdir()
    dst.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True).returncode:
        pytest.skip("bind mounts need root")
    try:
        assert not os.path.ismount(dst) and is_mount_point(dst) and not is_mount_point(src)
        assert quantize(dst, "--overwrite").returncode == 2
    finally:
        subprocess.run(["umount", str(dst)], check=True)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_directory_on_another_device_is_a_mount_point_only_at_its_root(tmp_path):
    assert os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev
    assert is_mount_point(Path("/dev/shm")) and not is_mount_point(tmp_path)
