"""tools/sass_loops.py: the loop finder on a hand-made disassembly, and (with triton installed) the
offline sm_90 compile of the decode split kernel and the W4A16 register kernel."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "sass_loops.py"
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


def _tool_module():
    spec = importlib.util.spec_from_file_location("sass_loops", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R2, [R4.64] ;
        /*0020*/                   HMMA.16816.F32 R8, R12, R16, R8 ;
        /*0030*/               @P0 IADD3 R3, R3, 0x1, RZ ;
        /*0040*/              @!P1 BRA 0x20 ;
        /*0050*/                   FADD R5, R5, R6 ;
        /*0060*/                   BRA 0x50 ;
        /*0070*/                   FFMA R5, R5, R6, R7 ;
        /*0080*/               @P2 BRA 0x90 ;
        /*0090*/                   EXIT ;
"""


def test_loops_are_backward_branches_with_an_mma():
    out = _tool_module().loops(SASS)
    # 0x20..0x40 is a loop with an HMMA; 0x50..0x60 loops without one; 0x80 branches forward
    assert out == [{"instructions": 3, "ops": {"HMMA": 1, "IADD3": 1, "BRA": 1}}]


def test_issue_order_lists_loads_mmas_and_backward_branches_in_program_order():
    # the LDG, the HMMA, two backward branches (0x40 -> 0x20, 0x60 -> 0x50); the forward one is not listed
    assert _tool_module().issue_order(SASS) == "GM||"


def _run(*args):
    # TRITON_INTERPRET=1 as the CPU kernel tests set it: the tool must compile anyway
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, str(TOOL), *args, "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


@needs_triton
def test_decode_split_kernel_compiles_offline_and_reports_its_page_loop():
    r = _run("decode-split", "--kv", "fp8")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["arch"] == "sm_90" and rep["registers"] > 32 and rep["shared_bytes"] > 0
    inner = min(rep["loops"], key=lambda lp: lp["instructions"])
    # one 64-token page: 16 query heads x 64 tokens x 128 dims twice = 64 m16n8k16 MMAs per warp
    # at 2 warps, and two fp8 -> fp16 conversions per 2 elements of K and V
    assert inner["ops"]["HMMA"] == 64 and inner["ops"]["F2FP"] >= 128


@needs_triton
def test_w4a16_register_kernel_and_tma_spec_refused():
    r = _run("w4a16", "--spec", "bn=64,w=4,un=4,waves=4", "--m", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert "split 8, unroll 4" in rep["kernel"] and rep["loops"]
    assert any(op.endswith("MMA") for op in rep["loops"][0]["ops"])
    # unroll 4: the barrier of the shared-memory activation tile keeps ptxas from sinking the word
    # loads, so every block's words (4 blocks x 2 loads of 16 bytes per lane at BLOCK_N 64 / 4
    # warps) are issued before the first MMA
    order = rep["issue_order"]
    assert order.count("M") > 0 and order[:order.index("M")].count("G") >= 8, order
    bad = _run("w4a16", "--spec", "bn=64,tma=1")
    assert bad.returncode != 0 and "only the register kernel" in bad.stderr


@needs_triton
def test_w8a16_tensor_core_kernel_compiles_offline():
    r = _run("w8a16", "--m", "1", "--n", "16384")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert "waves=8" in rep["kernel"] and "split 4" in rep["kernel"] and rep["loops"]
    ops = rep["loops"][0]["ops"]
    # the words go straight to the MMA's registers: no shared-memory loads of them in the loop beyond
    # the activation tile's, and the dequantization is LOP3 / shifts / packed 16-bit fmas
    assert any(op.endswith("MMA") for op in ops) and ops["LOP3"] >= 128
    assert ops.get("HFMA2", 0) + ops.get("HADD2", 0) >= 128
    bad = _run("w8a16", "--spec8", "bias=1")
    assert bad.returncode != 0 and "bad W8A16 config field" in bad.stderr


@needs_triton
def test_selection_kernels_compile_offline_with_their_default_knobs():
    """Pass 1 (at 64 windows per step), pass 2 and both top-k kernels, as select_decode launches them for sala-9b: no MMA loop
    (pass 2's five windows are unrolled), so the whole kernel's count and mix are reported."""
    for extra in ([], ["--late"]):         # K1 scores before the PDL wait (default) or after it
        words = _run("select-words", *extra)
        assert words.returncode == 0, words.stderr[-2000:]
        rep = json.loads(words.stdout)
        assert "w4" in rep["kernel"] and rep["registers"] > 32 and rep["loops"] == []
        assert rep["kernel"].endswith("late") == bool(extra)
        # 32 blocks x 5 windows of 16 heads x 128 dims: 5 dots of [16, 128] x [128, 32]; each of the
        # 4 warps takes 8 of the 32 columns: one m16n8k16 per 16 of the 128 dims, 8 per dot
        assert rep["kernel_ops"]["HMMA"] == 40 and rep["instructions"] > rep["kernel_ops"]["HMMA"]
    lse = _run("select-lse", "--bw", "64")
    assert lse.returncode == 0, lse.stderr[-2000:]
    rep = json.loads(lse.stdout)
    # pass 1's loop: one [16, 128] x [128, 64] dot per step, 4 warps of 16 columns: 2 x 8 m16n8k16;
    # its softmax per (head, window slot) reduces nothing across lanes in the loop, per row it does
    assert "w4 s2 bw64" in rep["kernel"] and len(rep["loops"]) == 1 and rep["loops"][0]["ops"]["HMMA"] == 16
    assert "SHFL" not in rep["loops"][0]["ops"]
    per_row = _run("select-lse", "--bw", "64", "--per-row")
    assert per_row.returncode == 0, per_row.stderr[-2000:]
    rep = json.loads(per_row.stdout)
    assert rep["kernel"].endswith("per-row") and rep["loops"][0]["ops"]["SHFL"] > 0
    top = _run("select-top")
    assert top.returncode == 0, top.stderr[-2000:]
    rep = json.loads(top.stdout)
    assert "w8" in rep["kernel"] and rep["instructions"] > 1000 and "HMMA" not in rep["kernel_ops"]
    rank = _run("select-rank")
    assert rank.returncode == 0, rank.stderr[-2000:]
    rep = json.loads(rank.stdout)
    # one unsigned compare per (key, word) pair: the rank loops are mostly ISETP
    assert "rank" in rep["kernel"] and rep["kernel_ops"]["ISETP"] > 100 and "HMMA" not in rep["kernel_ops"]


@needs_triton
def test_w4a16_default_is_the_config_the_dispatch_ships_and_a_bad_spec_is_one_line():
    from salactl.runtime.ops.w4a16.tc_config import default_tc_config

    r = _run("w4a16", "--m", "1")                   # o_proj 4096x4096 at one row: its own table entry
    assert r.returncode == 0, r.stderr[-2000:]
    shipped = default_tc_config(1, 4096, 4096)
    assert (shipped.early, shipped.reduce) == (1, 8)
    assert f"dispatch default {shipped}" in json.loads(r.stdout)["kernel"]
    bad = _run("w4a16", "--spec", "wk=16")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "tools/sass_loops.py: --spec 'wk=16': bad W4A16 config field 'wk=16'; fields: bn, w, bias, un, pf, stages, "
        "waves, fit, split, red, tma, tkb, ew"]


@needs_triton
def test_w4a16_without_spec_refuses_a_shape_the_dispatch_runs_on_the_tma_kernel():
    from salactl.runtime.ops.w4a16.tc_config import default_tc_config

    assert default_tc_config(1, 16384, 4096).tma            # gate+up of sala-9b at one row: the TMA kernel
    r = _run("w4a16", "--m", "1", "--n", "16384", "--k", "4096")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "tools/sass_loops.py: the dispatch runs the TMA kernel at M=1 16384x4096; only the register kernel is "
        "supported: pass a --spec without tma="]
