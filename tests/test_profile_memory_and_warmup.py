"""`salactl profile` (torch.profiler, CPU) against memory and warm-up: running out of memory is a
capacity error (exit 11, one line, nothing in --out); the preflight counts the compressed keys the
caches hold and offers the --chunk-size that fits a prefill; the measured step does the same work
at any --warmup (the synthetic context holds its compressed keys, as a prefilled cache would, and
no step leaves its own behind); the total is the step's wall time, with the unattributed rest."""

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch

from salactl.profiling.preflight import _fixes, step_memory_bytes
from salactl.profiling.spec import ProfileSpec
from salactl.runtime.loader import available_host_bytes, model_config
from salactl.runtime.ops.selection import num_windows

from test_run_memory_checks import LIMITED

NANO = model_config("sala-nano")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}       # 2 shared cores; no per-core thread stacks in a limit


def profile(*args, env=ENV):
    return subprocess.run([sys.executable, "-m", "salactl", "profile", "--torch", "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=300, env=env)


# the CLI under an address-space limit (the checks see none, as with one a container hides) of what
# its modules take plus this: enough to load sala-nano, not for 16 sequences of 60,000 cached tokens
# (~1 GB of fp32 KV)
HEADROOM = 500_000_000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("phase, fix", [("decode", "lower --context or --batch"),
                                        ("prefill", "lower --context, --batch or --chunk-size")])
def test_profile_out_of_memory_is_a_capacity_error_and_leaves_nothing_in_out(tmp_path, phase, fix):
    spec = ProfileSpec(phases=(phase,), context=60_000, batch=16)
    if sum(step_memory_bytes(spec, NANO, 4, False)) > available_host_bytes():
        pytest.skip("the memory check before the profile would refuse it")
    out = tmp_path / "prof"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    r = subprocess.run([sys.executable, "-c", LIMITED, str(HEADROOM), "profile", "--torch", "--device", "cpu",
                        "--phase", phase, "--context", "60000", "--batch", "16", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 11 and r.stdout == "", r.stderr
    progress, line = r.stderr.strip().splitlines()
    assert progress.startswith("profiling ") and "Traceback" not in r.stderr
    assert line.startswith("error: profile ran out of memory (") and line.endswith(fix), line
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]         # no staging left, no partial profile


def test_the_preflight_counts_every_cache_tensor_the_workload_holds():
    """KV at its capacity (context + the step's tokens), the compressed keys (K1) of all of them
    once the step ran, the lightning states: all within step_memory_bytes' caches."""
    from salactl.profiling.workload import build

    for phase in ("decode", "prefill"):
        spec = ProfileSpec(phases=(phase,), context=2048, chunk_size=256, batch=2, device="cpu", dtype="float32")
        w = build(spec)
        w.step(phase)
        held = sum(t.numel() * t.element_size() for seq in w.seqs[phase]
                   for store in (seq._k, seq._v, seq._k1, seq.state) for t in store.values())
        assert held <= step_memory_bytes(spec, w.config, 4, False, reference=False)[0], phase


def test_the_synthetic_context_holds_its_compressed_keys_and_no_step_leaves_its_own():
    """As an engine's prefill leaves them: K1 for every full window of the context once it reached
    dense_len (none below it); a warm-up step's windows are gone before the next step."""
    from salactl.profiling.workload import build

    sc = NANO.sparse_config
    context = 10_007            # filled in slices; the decoded token completes one more window
    assert num_windows(context + 1, sc) == num_windows(context, sc) + 1
    for context, windows in ((context, num_windows(context, sc)), (sc.dense_len - 1, 0)):
        w = build(ProfileSpec(phases=("decode",), context=context, device="cpu", dtype="float32", seed=3))
        (seq,) = w.seqs["decode"]
        assert {k1.shape[0] for k1 in seq._k1.values()} == {windows}, context
        if windows:         # the fill's K1 is the compression of the cached keys
            layer = NANO.sparse_layers[-1]
            keys = seq._k[layer][:context]
            want = keys.unfold(0, sc.kernel_size, sc.kernel_stride).mean(-1)
            torch.testing.assert_close(seq._k1[layer], want)
        w.step("decode")
        # the step's token is a sparse row in both: it compresses what the cache lacks (at dense_len - 1: all)
        assert {k1.shape[0] for k1 in seq._k1.values()} == {num_windows(context + 1, sc)}
        w.prepare("decode")
        assert {k1.shape[0] for k1 in seq._k1.values()} == {windows}, context


def _measured_ops(d: dict) -> Counter:
    return Counter({(k["phase"], k["op"], k["name"]): k["count"] for k in d["kernels"]})


def test_the_measured_step_runs_the_same_ops_at_any_warmup(tmp_path):
    """Without a warm-up the decode step compressed the whole context (aten::mean/unfold, cat,
    sum in "attention"); with one, the prefill step skipped compressing its own chunk. The ops of
    the first forward of the process also include one-time lazy set-up (the lightning layers'
    decay constants), so the prefill step, which runs first, is compared on its attention ops."""
    runs = {}
    for warmup in (0, 1):
        p = profile("--phase", "both", "--context", "1024", "--chunk-size", "256", "--warmup", str(warmup),
                    "--top", "100000", "--json", "--out", str(tmp_path / f"w{warmup}"))
        assert p.returncode == 0, p.stderr
        runs[warmup] = _measured_ops(json.loads(p.stdout))
    cold, warm = runs[0], runs[1]
    assert {k: n for k, n in cold.items() if k[0] == "decode"} == {k: n for k, n in warm.items() if k[0] == "decode"}
    attention = lambda ops: {k: n for k, n in ops.items() if k[:2] == ("prefill", "attention")}  # noqa: E731
    assert attention(cold) == attention(warm)
    assert ("prefill", "attention", "aten::unfold") in warm          # the chunk's own windows, compressed


def test_the_total_is_the_steps_wall_time_with_an_unattributed_row(tmp_path, capsys):
    p = profile("--phase", "both", "--context", "512", "--chunk-size", "128", "--json", "--out", str(tmp_path / "p"))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    for phase, step in d["manifest"]["steps"].items():
        rows = [r for r in d["ops"] if r["phase"] == phase]
        assert [r["op"] for r in rows[-2:]] == ["other (unattributed)", "total"]
        rest, total = rows[-2:]
        named = sum(r["time_s"] for r in rows[:-2])
        assert total["time_s"] == step["wall_s"]
        assert rest["time_s"] == pytest.approx(max(step["wall_s"] - named, 0.0))
        assert rest["time_s"] >= 0 and rest["kernels"] == 0 and rest["analytic_bytes"] == 0
        # the total's rates are the wall time's
        assert total["achieved_gbps"] == pytest.approx(total["analytic_bytes"] / step["wall_s"] / 1e9)
        assert total["time_over_floor"] == pytest.approx(step["wall_s"] / total["floor_s"])
    from salactl.cmd_profile import render

    render(d)
    table = capsys.readouterr().out
    assert "total = the step's wall time" in table and "other (unattributed)" in table and "note:" not in table


def test_ops_that_add_up_past_the_wall_time_say_how_each_was_measured(capsys):
    from salactl.cmd_profile import render
    from salactl.profiling.session import tables
    from salactl.reports.profile_table import KernelSample

    zero = {"bytes": 0, "flops": 0}
    costs = {op: dict(zero) for op in ("qkv", "attention", "gla", "gates", "o_proj", "mlp", "lm_head", "other")}
    costs["mlp"] = {"bytes": 1e6, "flops": 1e6}
    manifest = {"mode": "torch", "device": "cpu", "steps": {"decode": {"analytic": costs, "wall_s": 0.004}}}
    peaks = {"mem_gbps": 20.0, "compute_tflops": 0.2}
    t = tables([KernelSample("aten::mm", "decode", 0, "mlp", 0.005)], manifest, peaks, 20)
    rest, total = t["ops"][-2:]
    assert (rest["op"], rest["time_s"], total["time_s"]) == ("other (unattributed)", 0.0, 0.004)
    (note,) = t["notes"]
    assert note.startswith("decode: its ops' times add up to 5.000 ms, more than the step's wall time, 4.000 ms")
    assert "self times of the aten ops" in note
    ncu = tables([KernelSample("k", "decode", 0, "mlp", 0.005)], {**manifest, "mode": "ncu"}, peaks, 20)
    assert [r["op"] for r in ncu["ops"]][-1] == "total" and ncu["ops"][-1]["time_s"] == 0.005
    assert "other (unattributed)" not in {r["op"] for r in ncu["ops"]} and ncu["notes"] == []


def test_prefill_advice_offers_the_largest_chunk_size_that_fits():
    """A 2,000,000-token prompt's 65,536-token chunk scores every window in fp32; --chunk-size sizes that."""
    spec = ProfileSpec(phases=("prefill",), context=2_000_000, chunk_size=65_536)
    need = lambda **change: sum(step_memory_bytes(dataclasses.replace(spec, **change), NANO, 4, False))  # noqa: E731
    avail = need(chunk_size=512)
    assert need() > avail
    message = _fixes(spec, NANO, 4, False, True, avail)
    chunk = int(message.split("--chunk-size (at most ")[1].split(" at this")[0].replace(",", ""))
    assert 512 <= chunk < 65_536 and need(chunk_size=chunk) <= avail < need(chunk_size=chunk + 1)
    assert message.endswith(f"or a smaller --chunk-size (at most {chunk:,} at this --context and --batch)")
    # a decode step's memory does not depend on --chunk-size: no such advice
    decode = dataclasses.replace(spec, phases=("decode",))
    short = sum(step_memory_bytes(decode, NANO, 4, False)) - 1
    assert "--chunk-size" not in _fixes(decode, NANO, 4, False, True, short)
