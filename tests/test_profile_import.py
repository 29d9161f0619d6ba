"""`salactl profile --import DIR` and the directories profiles leave: a torch profile replacing an
ncu one leaves none of the ncu files for --import to join with it, manifests of the wrong shape or
mode are one-line usage errors, a saved .ncu-rep is exported with --ncu-path, and the real H200
capture (tests/fixtures/ncu) gets its per-layer table."""

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.errors import ToolMissingError, UsageError
from salactl.profiling.session import replace_profile

from conftest import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "ncu"


def ncu_profile_dir(path: Path, manifest: dict | None = None, csv: bool = True) -> Path:
    """A saved ncu profile directory: the fixture's step.json (or `manifest`) and profile.csv."""
    path.mkdir(parents=True)
    if manifest is None:
        shutil.copy(FIXTURE / "step.json", path / "step.json")
    else:
        (path / "step.json").write_text(json.dumps(manifest))
    if csv:
        (path / "profile.csv").write_bytes(gzip.decompress((FIXTURE / "profile.csv.gz").read_bytes()))
    return path


def fixture_manifest() -> dict:
    return json.loads((FIXTURE / "step.json").read_text())


@pytest.fixture
def datasheet_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path / "cache"))


def test_torch_profile_over_an_ncu_one_leaves_only_its_own_files(tmp_path, capsys):
    saved = ncu_profile_dir(tmp_path / "p")
    for name in ("profile.ncu-rep", "ncu.log", "spec.json"):
        (saved / name).write_text("from the ncu run")
    (saved / "notes.txt").write_text("mine")          # not a profile's file: stays
    code, _, err = run_cli(["profile", "--torch", "--phase", "decode", "--context", 16, "--warmup", 0,
                            "--out", saved, "--overwrite"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in saved.iterdir()) == ["notes.txt", "result.json", "step.json", "trace.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]          # no staging or aside left
    code, out, err = run_cli(["profile", "--import", saved], capsys)
    assert code == UsageError.exit_code and out == ""
    (line,) = err.strip().splitlines()
    assert line == (f"error: {saved / 'step.json'} is the manifest of a torch profile, not an ncu one; "
                    "--import re-renders --ncu profiles only (a --torch profile's tables are in its result.json)")


def test_replacing_a_profile_puts_the_old_one_back_when_a_move_fails(tmp_path):
    final = ncu_profile_dir(tmp_path / "p")
    (final / "result.json").mkdir()                   # the move of the new result.json fails
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "step.json").write_text("new")
    (staging / "result.json").write_text("new")
    before = {p.name: p.read_bytes() for p in final.iterdir() if p.is_file()}
    with pytest.raises(UsageError, match="is a directory"):
        replace_profile(staging, final)
    assert {p.name: p.read_bytes() for p in final.iterdir() if p.is_file()} == before


def test_import_takes_ncu_manifests_with_and_without_the_mode(tmp_path, capsys, datasheet_peaks):
    """The fixture predates the mode key (an ncu manifest); the one a new ncu profile writes has it.
    Both get the per-layer table of the 9B's 32 layers, whose counts and bytes add up to the total."""
    from salactl.runtime.loader import model_config

    config = model_config("sala-9b", True)
    results = []
    for name, manifest in (("old", None), ("new", {"mode": "ncu", **fixture_manifest()})):
        code, out, err = run_cli(["profile", "--import", ncu_profile_dir(tmp_path / name, manifest), "--json"],
                                 capsys)
        assert code == 0, err
        results.append(json.loads(out))
    old, new = results
    assert [r["scope"] for r in old["layers"]] == [f"layer{i}" for i in range(32)] + ["lm_head", "embed_norm"]
    assert [r["kind"] for r in old["layers"][:32]] == [
        "sparse" if i in config.sparse_layers else "lightning" for i in range(32)]
    (total,) = [r for r in old["ops"] if r["op"] == "total"]
    assert sum(r["kernels"] for r in old["layers"]) == total["kernels"] == 420
    assert sum(r["dram_bytes"] for r in old["layers"]) == pytest.approx(total["dram_bytes"])
    assert sum(r["analytic_bytes"] for r in old["layers"]) == pytest.approx(total["analytic_bytes"])
    assert new["layers"] == old["layers"] and new["ops"] == old["ops"]
    code, out, _ = run_cli(["profile", "--import", tmp_path / "old", "--top", 1], capsys)
    assert out.splitlines()[0].endswith("(bfloat16, KV bfloat16, weights bf16); ceilings 4800 GB/s, 989 TFLOP/s "
                                        "(bf16 matmul; datasheet); 420 kernels")
    assert "decode: per layer" in out and "kernels (top offenders: time beyond the bytes' bandwidth floor)" in out


def _drop(manifest: dict, *path) -> dict:
    """`manifest` without the key at `path`."""
    *parents, last = path
    d = manifest
    for key in parents:
        d = d[key]
    del d[last]
    return manifest


def _set(manifest: dict, value, *path) -> dict:
    """`manifest` with `value` at `path`."""
    *parents, last = path
    d = manifest
    for key in parents:
        d = d[key]
    d[last] = value
    return manifest


BAD_MANIFESTS = {      # what is wrong: (the fixture's manifest -> the bad one, the message's tail)
    "a list": (lambda m: [], "it holds a JSON list, not an object"),
    "empty": (lambda m: {}, "it has no source, device, device_name, dtype, kv_dtype, steps"),
    "no steps": (lambda m: _drop(m, "steps"), "it has no steps"),
    "steps a list": (lambda m: _set(m, [], "steps"), "steps is not an object of phases"),
    "a step a list": (lambda m: _set(m, [], "steps", "decode"), "steps.decode is not an object"),
    "unknown phase": (lambda m: _set(m, m["steps"].pop("decode"), "steps", "train"),
                      "steps has the unknown phase 'train' (valid: prefill, decode)"),
    "no analytic": (lambda m: _drop(m, "steps", "decode", "analytic"), "steps.decode has no analytic"),
    "an op missing": (lambda m: _drop(m, "steps", "decode", "analytic", "mlp"),
                      "steps.decode.analytic is not an object with the op classes"),
    "bytes a string": (lambda m: _set(m, "12", "steps", "decode", "analytic_by_scope", "layer3", "mlp", "bytes"),
                       "steps.decode.analytic_by_scope.layer3.mlp is not an object with numbers bytes and flops"),
    "scopes a string": (lambda m: _set(m, "layer1", "steps", "decode", "scopes"),
                        "steps.decode.scopes is not a list of names"),
    "device a number": (lambda m: _set(m, 0, "device"), "device must be strings"),
    "config a list": (lambda m: _set(m, [], "config"), "config is not an object"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_import_of_a_json_that_is_not_a_manifest_is_a_usage_error(case, tmp_path, capsys):
    make, tail = BAD_MANIFESTS[case]
    saved = ncu_profile_dir(tmp_path / "p", make(fixture_manifest()))
    code, out, err = run_cli(["profile", "--import", saved], capsys)
    assert code == UsageError.exit_code and out == "", err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {saved / 'step.json'} is not a salactl profile manifest: {tail}"), line


def fake_ncu(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-ncu"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_import_exports_a_saved_report_with_the_ncu_path_given(tmp_path, capsys, datasheet_peaks):
    """--ncu-path applies to --import where only profile.ncu-rep is saved (a stand-in ncu that prints
    the fixture's CSV); where profile.csv is there it would be ignored, so it is refused."""
    saved = ncu_profile_dir(tmp_path / "p", csv=False)
    (saved / "profile.ncu-rep").write_bytes(b"a report")
    csv = tmp_path / "export.csv"
    csv.write_bytes(gzip.decompress((FIXTURE / "profile.csv.gz").read_bytes()))
    ncu = fake_ncu(tmp_path, f"cat '{csv}'")
    code, out, err = run_cli(["profile", "--import", saved, "--ncu-path", ncu, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["kernel_count"] == 420 and (saved / "profile.csv").read_bytes() == csv.read_bytes()
    code, _, err = run_cli(["profile", "--import", saved, "--ncu-path", ncu], capsys)
    assert code == UsageError.exit_code
    assert err.strip() == (f"error: --ncu-path applies only to exporting a profile.ncu-rep without a profile.csv, "
                           f"and {saved / 'profile.csv'} exists: drop --ncu-path")


def test_an_export_without_a_kernel_table_leaves_no_csv(tmp_path, capsys):
    saved = ncu_profile_dir(tmp_path / "p", csv=False)
    (saved / "profile.ncu-rep").write_bytes(b"a report")
    code, _, err = run_cli(["profile", "--import", saved, "--ncu-path", fake_ncu(tmp_path, "exit 0")], capsys)
    assert code == UsageError.exit_code and "no kernel table" in err
    assert sorted(p.name for p in saved.iterdir()) == ["profile.ncu-rep", "step.json"]


def test_import_without_ncu_says_how_to_export_the_report(tmp_path):
    import glob

    from salactl.profiling.ncu_runner import SEARCH_GLOBS

    if any(glob.glob(g) for g in SEARCH_GLOBS):
        pytest.skip("ncu is installed here")
    saved = ncu_profile_dir(tmp_path / "p", csv=False)
    (saved / "profile.ncu-rep").write_bytes(b"a report")
    env = {**os.environ, "SALACTL_NCU": str(tmp_path / "nonexistent" / "ncu"), "PATH": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "salactl", "profile", "--import", str(saved)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert p.returncode == ToolMissingError.exit_code, p.stderr
    assert p.stderr.strip() == (
        f"error: {saved / 'profile.ncu-rep'} has no profile.csv beside it, and exporting one needs Nsight Compute "
        "(ncu), which was not found; put ncu on PATH or pass --ncu-path, or export it where ncu is installed: "
        "ncu --import profile.ncu-rep --csv --page raw --print-units base > profile.csv")
