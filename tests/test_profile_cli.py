"""`salactl profile` through the real CLI: torch.profiler mode on CPU with the tiny preset, the
analytic table it joins with, and the clear errors of the ncu / NVML modes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from salactl.errors import (DeviceError, OutputExistsError, ProfilerFailedError, ProfilerPermissionError,
                            ToolMissingError, UsageError)
from salactl.profiling.ncu_runner import NcuOptions, classify_failure, find_ncu, nvtx_includes, profile_command
from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.presets import sala_nano
from salactl.runtime.roofline import call_costs, linear_costs

from conftest import gpu, run_cli, unwritable_out


def salactl(*args, **kw):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=300, **kw)


def in_process(monkeypatch, capsys, *args):
    """The real entry point (salactl.cli.main) without a new interpreter: (exit code, out, err)."""
    from salactl.cli import main

    monkeypatch.setattr(sys, "argv", ["salactl", *args])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_torch_mode_on_cpu_both_phases(tmp_path, capsys):
    out = tmp_path / "prof"
    p = salactl("profile", "--torch", "--model", "sala-nano", "--random-weights", "--phase", "both",
                "--context", "96", "--chunk-size", "32", "--device", "cpu", "--dtype", "bfloat16",
                "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["mode"] == "torch"
    assert d["manifest"]["weights"] == "bfloat16"          # the name run, bench and sweep record
    steps = d["manifest"]["steps"]
    assert (steps["prefill"]["new_tokens"], steps["prefill"]["cached_tokens"]) == (32, 64)
    assert (steps["decode"]["new_tokens"], steps["decode"]["cached_tokens"]) == (1, 96)
    with torch.device("meta"):
        model = SalaForCausalLM(sala_nano()).to(torch.bfloat16)
    for phase, rows in (("prefill", [(32, 64)]), ("decode", [(1, 96)])):
        want = call_costs(sala_nano(), linear_costs(model), rows, 1)
        ops = {r["op"]: r for r in d["ops"] if r["phase"] == phase}
        for op in ("qkv", "attention", "gla", "mlp", "lm_head"):
            assert ops[op]["analytic_bytes"] == want[op].bytes
            assert ops[op]["kernels"] > 0 and ops[op]["time_s"] > 0
            assert ops[op]["dram_bytes"] is None            # no counters in torch mode
        assert ops["total"]["time_s"] == pytest.approx(sum(r["time_s"] for o, r in ops.items() if o != "total"))
        # every aten op's self time counts (leaf ops alone dropped the GEMMs: 15% of the step)
        assert ops["total"]["time_s"] > 0.4 * steps[phase]["wall_s"]
    assert d["kernel_count"] == sum(r["kernels"] for r in d["ops"] if r["op"] == "total")
    check_rates(d)
    check_layers_add_up(d, sala_nano())
    trace = json.loads((out / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"decode", "prefill", "layer0", "attention", "gla"} <= names
    assert json.loads((out / "result.json").read_text())["mode"] == "torch"
    assert json.loads((out / "step.json").read_text())["mode"] == "torch"      # --import refuses it
    from salactl.cmd_profile import render

    render(d)
    table = capsys.readouterr().out
    assert "per op" in table and "lm_head" in table and "top offenders" in table
    header = table.splitlines()[0]
    # torch.profiler on CPU counts aten ops (wrappers included), not kernels; and measures no bytes
    assert header.endswith(f"; {d['kernel_count']} aten ops") and "weights bfloat16" in header, header
    assert "bandwidth floor" not in table and "aten ops (top offenders: most time first" in table
    assert "prefill: per layer" in table and "decode: per layer" in table and "lightning" in table
    assert "TFLOP/s" in table and "% peak " in table
    render({**d, "peaks": {"device": "cpu", "mem_gbps": 20.0, "bf16_tflops": 0.2, "source": "cpu-default"}})
    assert "ceilings 20 GB/s, 0.2 TFLOP/s (bf16 matmul; cpu-default)" in capsys.readouterr().out
    assert d["peaks"]["compute_rate"] == "bf16"           # a bfloat16 model's step


def check_rates(d: dict) -> None:
    """Every timed op row: achieved TFLOP/s = analytic FLOPs / time, and % of peak that of the binding
    resource (as `run`'s roofline): the higher of bandwidth % and compute %."""
    tflops = d["peaks"]["compute_tflops"]
    for r in d["ops"]:
        if r["op"] == "other (unattributed)":     # time with no op: what it moved or computed is unknown
            assert r["achieved_tflops"] is r["achieved_gbps"] is r["pct_of_peak"] is None
            continue
        if not r["time_s"]:
            continue
        assert r["achieved_tflops"] == pytest.approx(r["analytic_flops"] / r["time_s"] / 1e12)
        assert r["pct_of_peak"] == pytest.approx(max(r["pct_of_peak_bw"], 100 * r["achieved_tflops"] / tflops))
    prefill = [r for r in d["ops"] if r["phase"] == "prefill" and r["op"] == "total"]
    for r in prefill:       # sala-nano's prefill chunk is FLOP-bound: its % of peak is the compute one
        assert r["floor_s"] == pytest.approx(r["analytic_flops"] / (tflops * 1e12))
        assert r["pct_of_peak"] == pytest.approx(100 * r["achieved_tflops"] / tflops)
        assert r["pct_of_peak"] > r["pct_of_peak_bw"]


def check_layers_add_up(d: dict, config, scopes=None) -> None:
    """The per-layer rows of each phase: the covered scopes in model order, each layer's mixer kind,
    and times, counts and analytic costs that add up to the per-op table's total."""
    want = scopes or [f"layer{i}" for i in range(config.num_hidden_layers)] + ["lm_head", "embed_norm"]
    for phase in d["manifest"]["steps"]:
        rows = [r for r in d["layers"] if r["phase"] == phase]
        (total,) = [r for r in d["ops"] if r["phase"] == phase and r["op"] == "total"]
        assert [r["scope"] for r in rows] == want
        for r in rows:
            if r["layer"] is not None:
                assert r["kind"] == ("sparse" if r["layer"] in config.sparse_layers else "lightning")
            assert r["kernels"] > 0 and r["time_over_floor"] == pytest.approx(r["time_s"] / r["floor_s"])
        assert sum(r["kernels"] for r in rows) == total["kernels"]
        named = [r for r in d["ops"] if r["phase"] == phase and r["op"] not in ("total", "other (unattributed)")]
        assert sum(r["time_s"] for r in rows) == pytest.approx(sum(r["time_s"] for r in named))
        assert sum(r["analytic_bytes"] for r in rows) == pytest.approx(total["analytic_bytes"])
        assert sum(r["analytic_flops"] for r in rows) == pytest.approx(total["analytic_flops"])


def test_w4a16_and_fp8_kv_profile_on_cpu(tmp_path, capsys):
    p = salactl("profile", "--torch", "--model", "sala-nano", "--random-weights", "--context", "64",
                "--device", "cpu", "--weights", "w4a16", "--kv-cache-dtype", "fp8_e5m2",
                "--out", str(tmp_path / "q"), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    ops = {r["op"]: r for r in d["ops"]}
    # sala-nano MLP: 8 layers x 3 x 256 x 768 weights; W4A16 reads ~0.5 B/weight (+ scales) < bf16's 2
    assert ops["mlp"]["analytic_bytes"] < 0.4 * 2 * 8 * 3 * 256 * 768
    assert d["manifest"]["kv_dtype"] == "fp8_e5m2" and d["manifest"]["weights"] == "w4a16"
    from salactl.cmd_profile import render

    render(d)
    assert "(float32, KV fp8_e5m2, weights w4a16)" in capsys.readouterr().out.splitlines()[0]
    p8 = salactl("profile", "--torch", "--model", "sala-nano", "--random-weights", "--context", "64",
                 "--device", "cpu", "--weights", "w8a16", "--out", str(tmp_path / "q8"), "--json")
    assert p8.returncode == 0, p8.stderr
    mlp8 = {r["op"]: r for r in json.loads(p8.stdout)["ops"]}["mlp"]["analytic_bytes"]
    assert ops["mlp"]["analytic_bytes"] < mlp8 < 0.6 * 2 * 8 * 3 * 256 * 768       # ~1 B/weight + scales


def test_existing_profile_needs_overwrite(tmp_path):
    out = tmp_path / "p"
    args = ("profile", "--torch", "--model", "sala-nano", "--random-weights", "--context", "16", "--device",
            "cpu", "--out", str(out), "--json")
    assert salactl(*args).returncode == 0
    before = (out / "result.json").read_text()
    p = salactl(*args)
    assert p.returncode == OutputExistsError.exit_code and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and str(out / "result.json") in p.stderr, p.stderr  # before any work
    assert "--overwrite" in p.stderr and (out / "result.json").read_text() == before
    p = salactl(*args, "--overwrite")
    assert p.returncode == 0, p.stderr
    assert json.loads((out / "result.json").read_text())["elapsed_s"] == json.loads(p.stdout)["elapsed_s"]


@pytest.mark.parametrize("case", ["proc", "below_a_file"])
def test_unwritable_out_is_a_usage_error_before_any_work(tmp_path, case):
    out = unwritable_out(tmp_path, case)
    p = salactl("profile", "--torch", "--model", "sala-nano", "--random-weights", "--context", "16", "--device",
                "cpu", "--out", out)
    assert p.returncode == UsageError.exit_code, p.stderr
    assert p.stderr.startswith("error: --out") and p.stderr.strip().count("\n") == 0, p.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_ncu_without_gpu_is_a_clear_error(tmp_path):
    p = salactl("profile", "--ncu", "--model", "sala-nano", "--random-weights", "--out", str(tmp_path / "x"))
    assert p.returncode == DeviceError.exit_code
    assert "--torch" in p.stderr and p.stderr.strip().count("\n") == 0


def test_bad_options_are_usage_errors(tmp_path, monkeypatch, capsys):
    for args in (["--phase", "train"], ["--batch", "0"], ["--layers", "1,x"], ["--ncu", "--torch"],
                 ["--weights", "int3"], ["--layers", "99"], ["--layers", "1_0"], ["--layers", "+1"]):
        code, _, err = in_process(monkeypatch, capsys, "profile", "--model", "sala-nano", "--random-weights",
                                  "--device", "cpu", "--out", str(tmp_path / "y"), *args)
        assert code == UsageError.exit_code, (args, err)
        assert err.strip().splitlines()[-1].startswith("error: ")
    assert not (tmp_path / "y").exists()                       # nothing written on bad input
    code, _, err = in_process(monkeypatch, capsys, "profile", "--import", str(tmp_path / "nothing"))
    assert code == UsageError.exit_code and f"--import {tmp_path / 'nothing'} does not exist" in err


def test_ncu_command_line():
    inc = nvtx_includes(("decode",), ("layer1", "lm_head"))
    assert inc == ["decode/layer1/", "decode/lm_head/"]
    assert nvtx_includes(("prefill", "decode"), None) == ["prefill/", "decode/"]
    cmd = profile_command("/x/ncu", "/o/rep", inc, ["python", "-m", "m"], NcuOptions(launch_skip=5, launch_count=40))
    s = " ".join(cmd)
    assert "--clock-control none" in s and "--nvtx --nvtx-include decode/layer1/ --nvtx-include decode/lm_head/" in s
    assert "--launch-skip 5 --launch-count 40" in s and s.endswith("-f -o /o/rep python -m m")
    metrics = cmd[cmd.index("--metrics") + 1].split(",")
    assert {"gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"} <= set(metrics)
    sol = profile_command("ncu", "r", inc, [], NcuOptions(metric_set="sol"))
    assert "sm__throughput.avg.pct_of_peak_sustained_elapsed" in sol[sol.index("--metrics") + 1]
    with pytest.raises(UsageError):
        NcuOptions(metric_set="everything")


def test_ncu_failures_are_classified():
    e = classify_failure("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", 1)
    assert isinstance(e, ProfilerPermissionError) and "ERR_NVGPUCTRPERM" in str(e)
    e = classify_failure("==ERROR== Failed to initialize the profiler: LibraryNotLoaded", 1)
    assert isinstance(e, ProfilerPermissionError)
    assert e.exit_code == 13
    e = classify_failure("Traceback ...\nRuntimeError: boom\n==PROF== Disconnected from process 7\n", 1)
    assert "boom" in str(e) and "\n" not in str(e)
    assert type(e) is ProfilerFailedError and e.exit_code == 14
    e = classify_failure("error: --layers 99 is out of range\n==PROF== Disconnected\n", 2)
    assert str(e).endswith("error: --layers 99 is out of range")
    assert type(e) is ProfilerFailedError and e.exit_code == 14
    with pytest.raises(ToolMissingError, match="not an executable"):
        find_ncu("/nonexistent/ncu")


def test_ncu_not_found_names_the_usual_places(monkeypatch):
    import glob

    from salactl.profiling import ncu_runner

    if any(glob.glob(g) for g in ncu_runner.SEARCH_GLOBS):
        pytest.skip("ncu is installed here")
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("SALACTL_NCU", raising=False)
    with pytest.raises(ToolMissingError, match=r"/usr/local/cuda/bin or /opt/nvidia/nsight-compute/"):
        find_ncu()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-NVML error")
def test_nvml_without_driver_is_a_device_error(tmp_path):
    p = salactl("profile", "--torch", "--nvml", "--model", "sala-nano", "--random-weights", "--context", "16",
                "--device", "cpu", "--out", str(tmp_path / "n" / "a" / "b"))
    assert p.returncode == DeviceError.exit_code and "NVML" in p.stderr
    assert list(tmp_path.iterdir()) == []            # checked before any directory was made


def test_interrupted_profile_leaves_no_parent_of_out_behind(tmp_path):
    """SIGTERM while the step runs: no --out, none of its missing parents, no staging directory."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "salactl", "profile", "--torch", "--random-weights", "--phase",
                             "decode", "--context", "64", "--warmup", "100", "--device", "cpu",
                             "--out", str(tmp_path / "new" / "a" / "b")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(tmp_path.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, "the profile ended before the signal"    # its session has begun
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert list(tmp_path.iterdir()) == []


@gpu
def test_torch_mode_on_gpu_attributes_cuda_kernels(tmp_path):
    p = salactl("profile", "--torch", "--nvml", "--model", "sala-nano", "--random-weights", "--context", "128",
                "--device", "cuda", "--out", str(tmp_path / "g"), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    ops = {r["op"]: r for r in d["ops"]}
    assert ops["mlp"]["kernels"] > 0 and ops["lm_head"]["kernels"] > 0
    # the engine's Triton kernels (launched outside any aten op) are attributed too
    assert ops["attention"]["kernels"] > 0 and ops["gla"]["kernels"] > 0, ops
    assert d["nvml"]["samples"] >= 1


def test_layers_scope_the_kernel_count(tmp_path):
    p = salactl("profile", "--torch", "--model", "sala-nano", "--random-weights", "--phase", "decode",
                "--context", "32", "--device", "cpu", "--layers", "1,lm_head", "--out", str(tmp_path / "p"), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    (total,) = [r for r in d["ops"] if r["op"] == "total"]
    assert d["kernel_count"] == total["kernels"] > 0
    check_layers_add_up(d, sala_nano(), scopes=["layer1", "lm_head"])


def fake_ncu(tmp_path, body: str) -> str:
    """A real executable standing in for ncu (SALACTL_NCU names it): a shell script."""
    path = tmp_path / "fake-ncu"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


NCU_FAILURES = {   # exit code: the fake ncu's script
    ProfilerPermissionError.exit_code: "echo '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission'; exit 1",
    ProfilerFailedError.exit_code: "echo '==ERROR== something else broke: tail line 42'; exit 1",
}


def _no_ncu_installed():
    import glob

    from salactl.profiling import ncu_runner

    return not any(glob.glob(g) for g in ncu_runner.SEARCH_GLOBS)


def saved_report(tmp_path):
    """A saved ncu profile directory holding its manifest (the real capture's) and a report to export."""
    saved = tmp_path / "saved"
    saved.mkdir()
    shutil.copy(Path(__file__).parent / "fixtures" / "ncu" / "step.json", saved / "step.json")
    (saved / "profile.ncu-rep").write_bytes(b"not a report")
    return saved


@pytest.mark.parametrize("code", sorted(NCU_FAILURES))
def test_ncu_failure_exit_codes_on_cpu_through_import(tmp_path, code):
    """`profile --import DIR` exports a saved .ncu-rep without its CSV through the ncu that
    SALACTL_NCU names: the CPU path to ncu's failures. 13: no counter permission, 14: other."""
    saved = saved_report(tmp_path)
    env = {**os.environ, "SALACTL_NCU": fake_ncu(tmp_path, NCU_FAILURES[code])}
    p = salactl("profile", "--import", str(saved), env=env)
    assert p.returncode == code, (p.returncode, p.stderr)
    assert p.stderr.startswith("error: ") and p.stderr.strip().count("\n") == 0, p.stderr
    assert ("ERR_NVGPUCTRPERM" if code == 13 else "ncu exited with code 1: ==ERROR== something else broke: "
            "tail line 42") in p.stderr
    assert not (saved / "profile.csv").exists()


@pytest.mark.skipif(not _no_ncu_installed(), reason="ncu is installed here")
def test_missing_ncu_exit_code_on_cpu_through_import(tmp_path):
    saved = saved_report(tmp_path)
    env = {**os.environ, "SALACTL_NCU": str(tmp_path / "nonexistent" / "ncu"), "PATH": str(tmp_path)}
    p = salactl("profile", "--import", str(saved), env=env)
    assert p.returncode == ToolMissingError.exit_code == 12, p.stderr
    assert "ncu" in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr


GPU_NCU_ARGS = ("profile", "--ncu", "--model", "sala-nano", "--random-weights", "--phase", "decode",
                "--context", "16")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("how", ["ncu-path", "SALACTL_NCU"])
def test_ncu_missing_exits_12(tmp_path, how):
    """--ncu-path names no file; or SALACTL_NCU names none and nothing else finds ncu (an
    installed ncu under /usr/local/cuda or /opt/nvidia would be found: skipped then)."""
    env = {**os.environ}
    args = [*GPU_NCU_ARGS, "--out", str(tmp_path / "p")]
    if how == "ncu-path":
        args += ["--ncu-path", str(tmp_path / "nonexistent" / "ncu")]
    else:
        if not _no_ncu_installed():
            pytest.skip("ncu is installed in a searched place")
        env.update(SALACTL_NCU=str(tmp_path / "nonexistent" / "ncu"), PATH=os.path.dirname(sys.executable))
    p = salactl(*args, env=env)
    assert p.returncode == ToolMissingError.exit_code == 12, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "ncu" in p.stderr, p.stderr


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("code,script", [*NCU_FAILURES.items(),
                                         (ProfilerFailedError.exit_code, "echo '==PROF== No kernels were profiled.'")])
def test_ncu_failures_exit_13_and_14(tmp_path, code, script):
    """A fake ncu (SALACTL_NCU) that reports no counter permission (13), fails otherwise (14), or
    exits 0 without writing a report because it saw no kernels (14)."""
    env = {**os.environ, "SALACTL_NCU": fake_ncu(tmp_path, script)}
    out = tmp_path / "p"
    p = salactl(*GPU_NCU_ARGS, "--out", str(out), env=env)
    assert p.returncode == code, (p.returncode, p.stderr)
    assert p.stderr.strip().splitlines()[-1].startswith("error: "), p.stderr
    assert not (out / "profile.ncu-rep").exists() and not (out / "result.json").exists()
    if "No kernels" in script:
        assert "profiled no kernels" in p.stderr


def test_a_failed_profile_leaves_no_file_behind(tmp_path, capsys):
    """The session works in a staging folder beside --out and moves its files in only at the end."""
    out = tmp_path / "p"
    code, _, err = run_cli(["profile", "--torch", "--phase", "decode", "--context", 16, "--layers", 99,
                            "--out", out], capsys)
    assert code == 2 and "out of range" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    code, _, _ = run_cli(["profile", "--torch", "--phase", "decode", "--context", 16, "--out", out], capsys)
    assert code == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    assert {"result.json", "step.json", "trace.json"} <= {p.name for p in out.iterdir()}
    assert str(tmp_path / ".p.tmp") not in (out / "result.json").read_text()


def test_fp8_kv_profile_of_a_checkpoint_with_calibrated_scales(tmp_path, capsys):
    """`quantize --kv-cache-dtype fp8_e4m3` stores one scale per layer; profile expands them per KV
    head as run and bench do (it indexed the scalar and crashed); without them it profiles the same
    work at scale 1.0 (the 9B's e4m3 path has no calibrated random-weights checkpoint)."""
    ckpt = tmp_path / "q"
    code, _, err = run_cli(["quantize", "--model", "sala-nano", "--out", ckpt, "--method", "rtn", "--kv-cache-dtype",
                            "fp8_e4m3", "--calib", "random", "--nsamples", 2, "--seqlen", 64, "--device", "cpu"], capsys)
    assert code == 0, err
    for kv in ("fp8_e4m3", "fp8_e5m2"):
        code, out, err = run_cli(["profile", "--torch", "--model", ckpt, "--weights", "w4a16", "--kv-cache-dtype", kv,
                                  "--context", 16, "--device", "cpu", "--out", tmp_path / kv, "--json"], capsys)
        assert code == 0, err
        assert json.loads(out)["manifest"]["kv_dtype"] == kv
    code, out, err = run_cli(["profile", "--torch", "--random-weights", "--kv-cache-dtype", "fp8_e4m3", "--context",
                              16, "--device", "cpu", "--out", tmp_path / "uncalibrated", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["manifest"]["kv_dtype"] == "fp8_e4m3"


@pytest.mark.parametrize("args, named", [
    (["--torch", "--context", "16", "--phase", "decode", "--chunk-size", "16"], "--chunk-size"),
    (["--import", "saved", "--model", "sala-9b", "--overwrite"], "--model, --overwrite"),
    (["--import", "saved", "--phase", "prefill", "--top", "3", "--json"], "--phase"),
])
def test_options_that_would_be_ignored_are_usage_errors(args, named, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = in_process(monkeypatch, capsys, "profile", *args)
    assert code == UsageError.exit_code and out == "", err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {named} appl"), line
    assert list(tmp_path.iterdir()) == []


def test_layers_take_plain_indices_only():
    """int() reads "1_0" as 10 and "+1" as 1; --layers takes ASCII digits (a negative index keeps its
    own message)."""
    from salactl.profiling.spec import ProfileSpec, parse_layers

    assert parse_layers(" 1, 9 ,lm_head") == ((1, 9), True)
    for text in ("1_0", "+1", "\uff11", "\u0663", "1.0"):
        with pytest.raises(UsageError, match="--layers takes layer indices"):
            parse_layers(text)
    layers, head = parse_layers("-1")
    with pytest.raises(UsageError, match=r"--layers needs layer indices >= 0"):
        ProfileSpec(layers=layers, lm_head=head)


def test_context_past_the_trained_length_warns_as_run_does(monkeypatch, capsys):
    """sala-nano was trained to 65,536 positions; a decode step after 65,536 cached tokens runs at the
    65,537th, a 65,536-token prefill does not pass it. Checked before the model loads."""
    from salactl import output
    from salactl.profiling.preflight import check_spec
    from salactl.profiling.spec import ProfileSpec

    monkeypatch.setattr(output, "_warned", set())
    check_spec(ProfileSpec(phases=("prefill",), context=65536, device="cpu"))
    assert capsys.readouterr().err == ""
    check_spec(ProfileSpec(phases=("decode",), context=65536, device="cpu"))
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("warning: --context plus the decoded token is 65,537 tokens, past the model's "
                    "max_position_embeddings (65,536); it runs, but quality beyond the trained length is not "
                    "guaranteed")
    check_spec(ProfileSpec(phases=("prefill",), context=70000, device="cpu"))
    assert "warning: --context is 70,000 tokens, past the model's max_position_embeddings" in capsys.readouterr().err
