"""`salactl report memory`'s group size never looks a preset name up as a directory: from a working
directory without search permission (`sudo -u alice salactl report memory` in /root) the default
--model sala-nano was "error: Permission denied (sala-nano)", exit 1. A --model path that cannot be
looked up stays exit 4 (checkpoint), in one line.

Run as root with the capabilities that bypass directory permissions dropped from the child, as a
user without them runs it."""

import ctypes
import json
import os
import subprocess
import sys

import pytest

from salactl.errors import CheckpointError

from conftest import run_cli

CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24
MEMORY = ("report", "memory", "--context", "4096", "--gpu", "H100", "--weights", "w4a16", "--json")


def drop_dac_capabilities() -> None:
    """Out of the bounding set, so that the exec'd salactl runs as root without them."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def salactl_without_dac(cwd, *args) -> subprocess.CompletedProcess:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("drops root's capabilities (Linux, as root)")
    try:
        return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], cwd=cwd, capture_output=True,
                              text=True, timeout=120, preexec_fn=drop_dac_capabilities)
    except subprocess.SubprocessError as e:         # prctl refused (no CAP_SETPCAP): the preexec_fn failed
        pytest.skip(f"cannot drop capabilities: {e}")


@pytest.fixture
def unsearchable(tmp_path):
    where = tmp_path / "locked"
    where.mkdir(mode=0)
    yield where
    where.chmod(0o700)


def test_a_preset_from_an_unsearchable_working_directory_is_the_preset(unsearchable):
    r = salactl_without_dac(unsearchable, *MEMORY)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["model"] == "sala-nano" and list(report["server"]) == ["w4a16"]


def test_a_model_path_under_an_unsearchable_directory_is_a_checkpoint_error(unsearchable):
    model = unsearchable / "ckpt"
    r = salactl_without_dac("/", *MEMORY, "--model", model)
    assert r.returncode == CheckpointError.exit_code, r.stderr
    assert r.stderr.splitlines() == [f"error: cannot look up model (--model) {model} (Permission denied); fix the "
                                     "permissions of the directories above it"]


def test_a_directory_named_like_the_preset_does_not_set_its_group_size(tmp_path, monkeypatch, capsys):
    """--model sala-nano is the preset's shapes (planning_config), so not the group size of a GPTQ
    checkpoint that happens to be called sala-nano in the working directory either."""
    from salactl.runtime.loader import EMBEDDED_DIR

    def weights() -> int:
        code, out, err = run_cli(MEMORY, capsys)
        assert code == 0, err
        return json.loads(out)["server"]["w4a16"]["weights"]["total"]

    monkeypatch.chdir(tmp_path)
    preset = weights()
    (tmp_path / "sala-nano").mkdir()
    config = json.loads((EMBEDDED_DIR / "config.json").read_text())
    (tmp_path / "sala-nano" / "config.json").write_text(json.dumps({**config, "quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True}}))
    assert weights() == preset
    code, out, _ = run_cli([*MEMORY, "--model", tmp_path / "sala-nano"], capsys)      # as a path it is read
    assert code == 0 and json.loads(out)["server"]["w4a16"]["weights"]["total"] > preset
