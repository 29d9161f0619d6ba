"""The GPU benchmark scripts fail loudly: a run whose sections, cases, checks or requests failed
prints its table (failures named) and exits 1, so it cannot pass for a good one (BENCHMARKS.md's
numbers come from them); bad option combinations and specs stop before any GPU work. Run on the
CPU, where every CUDA section fails; the graph-capture run uses Triton's interpreter."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the sections would run for real")


def script(args, cwd=ROOT, **env):
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env={**base, **env}, capture_output=True,
                          text=True, timeout=600)


def table_rows(stdout: str) -> list[str]:
    """The rows of the table printed last."""
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("| measurement |"))
    return [line for line in lines[start + 2:] if line.startswith("|")]


@no_cuda
def test_quant_engine_bench_exits_1_and_names_the_sections_that_errored(tmp_path):
    p = script(["benchmarks/quant_engine_bench.py", "--only", "decode", "--bits", "8", "--out", str(tmp_path)])
    assert p.returncode == 1, p.stderr[-2000:]
    rows = table_rows(p.stdout)
    assert [r.split(" | ")[0] for r in rows] == ["| ceilings", "| decode"]
    assert all("ERROR" in r for r in rows)
    assert "quant_engine_bench.py: 2 failed: ceilings; decode" in p.stderr
    assert "error" in json.loads((tmp_path / "gpu_bench.json").read_text())["decode"]


@no_cuda
def test_gpu_engine_bench_exits_1_and_names_the_sections_that_errored(tmp_path):
    p = script(["benchmarks/gpu_engine_bench.py", "--only", "checks", "--out", str(tmp_path)])
    assert p.returncode == 1, p.stderr[-2000:]
    rows = table_rows(p.stdout)
    assert [r.split(" | ")[0] for r in rows] == ["| ceilings", "| checks"]
    assert "gpu_engine_bench.py: 2 failed: ceilings; checks" in p.stderr


def test_failures_finds_errored_cases_wrong_candidates_and_failed_checks():
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_engine_bench as G
    finally:
        sys.path.remove(str(BENCH))
    good = {"ceilings": {"copy_tb_s": 3.3, "section_s": 1.0},
            "decode": {"b1_ctx4096": {"replay_ms": 5.0, "kernels": {"top": [("k", 1.0, 1)]}}},
            "checks": {"passed": 7, "failed": 0, "failures": []},
            "gemv": {"o_proj": {"configs": {"(8, 512, 4, 4)": {"us": 3.0, "rel_err": 1e-3}}}}}
    assert G.failures(good) == []
    bad = {**good,
           "decode": {"b1_ctx4096": {"replay_ms": 5.0}, "b8_ctx4096": {"error": "RuntimeError: boom"}},
           "checks": {"passed": 5, "failed": 2, "failures": [("x", 1.0, 0.1)]},
           "gemv": {"o_proj": {"configs": {"(8, 512, 4, 4)": {"error": 0.5}}}},
           "prefill": {"error": "OutOfMemoryError: no", "section_s": 0.1}}
    assert G.failures(bad) == [("decode b8_ctx4096", "RuntimeError: boom"), ("checks", "2 checks failed"),
                               ("gemv o_proj configs (8, 512, 4, 4)", "wrong result, rel err 0.5"),
                               ("prefill", "OutOfMemoryError: no")]


def test_a_wrong_fp8_attention_output_is_a_failure_and_is_not_timed():
    sys.path.insert(0, str(BENCH))
    try:
        import quant_engine_bench as QE
    finally:
        sys.path.remove(str(BENCH))

    def never():
        raise AssertionError("a wrong output was timed")

    ok = QE.attention_row(3e-3, lambda: 2e-5, 2_000_000)
    assert ok == pytest.approx({"us": 20.0, "kv_mb": 2.0, "gb_s": 100.0, "rel_err": 3e-3})
    results = {"fp8": {"ctx32768": {"bf16": ok, "fp8_e4m3": QE.attention_row(float("nan"), never, 1)},
                       "ctx131072": {"bf16": ok, "fp8_e4m3": QE.attention_row(0.2, never, 1)}}}
    assert QE.G.failures(results) == [("fp8 ctx32768 fp8_e4m3", "wrong result, rel err nan"),
                                      ("fp8 ctx131072 fp8_e4m3", "wrong result, rel err 0.2")]
    # the bound is 1e-2: 5% off the fp32 reference is a wrong output, 1% is not
    assert QE.attention_row(0.05, never, 1) == {"error": 0.05}
    assert QE.attention_row(0.011, never, 1) == {"error": 0.011}
    assert "error" not in QE.attention_row(0.01, lambda: 1e-5, 1)


def test_w4a16_variants_with_bits_8_are_refused_before_any_work():
    p = script(["benchmarks/quant_engine_bench.py", "--bits", "8", "--w4a16-variants", "a:ew=-1"])
    assert p.returncode == 2
    assert "--w4a16-variants" in p.stderr and "--bits 8" in p.stderr
    assert p.stdout == ""                           # no section (not even the ceilings) started


@pytest.mark.parametrize("args, message", [
    (["--configs", "bogus=1"], "unknown key 'bogus'"),
    (["--configs", "bn=32;bn=x"], "bn wants an integer, got 'x'"),
    (["--tc8", ";zz=1"], "--tc8 'zz=1': bad W8A16 config field"),
])
def test_w8a16_bench_refuses_a_bad_spec_before_touching_cuda(args, message):
    pytest.importorskip("triton")
    p = script(["w8a16_bench.py", *args], cwd=BENCH)
    assert p.returncode == 1
    assert message in p.stderr
    assert "Traceback" not in p.stderr and "CUDA" not in p.stderr


def test_w8a16_bench_names_every_kernel_checked_wrong():
    pytest.importorskip("triton")
    sys.path.insert(0, str(BENCH))
    try:
        import w8a16_bench
    finally:
        sys.path.remove(str(BENCH))
    labels = ["default", "bn=32", "tc8:un=2"]
    rows = [{"shape": "o_proj", "M": 1, "bf16_us": 9.0, "default": 4.0, "bn=32": 4.5, "tc8:un=2": 3.9},
            {"shape": "o_proj", "M": 8, "bf16_us": 9.5, "bn=32": 5.0}]
    assert w8a16_bench.wrong_cells(rows[:1], labels) == []
    assert w8a16_bench.wrong_cells(rows, labels) == ["o_proj M=8 default", "o_proj M=8 tc8:un=2"]


GRAPH_CAPTURE_RUN = """
    import argparse, sys
    import torch
    sys.path[:0] = [{tests!r}, {bench!r}]
    from conftest import micro_model
    from graph_capture_bench import report, run_mode
    from salactl.bench.requests import BenchRequest

    model = micro_model()
    with torch.no_grad():
        model.model.embed_tokens.weight[99] = float("inf")    # NaN logits for a prompt holding 99
    requests = [BenchRequest("good", 3, 2, (5, 6, 7)), BenchRequest("bad", 3, 2, (5, 99, 6))]
    args = argparse.Namespace(device="cpu", model="micro", concurrency=1)
    row = run_mode(model, False, args, requests)
    assert (row["completed"], row["requests"]) == (1, 2), row
    sys.exit(report([row]))
"""


@no_cuda
def test_graph_capture_bench_counts_failed_requests_and_exits_1():
    pytest.importorskip("triton")
    code = textwrap.dedent(GRAPH_CAPTURE_RUN).format(tests=str(ROOT / "tests"), bench=str(BENCH))
    p = script(["-c", code], TRITON_INTERPRET="1")
    assert p.returncode == 1, p.stderr[-3000:]
    header, row = p.stdout.splitlines()[-2:]
    cells = dict(zip(header.split(" | "), row.split(" | ")))
    assert cells["mode"] == "lazy" and cells["completed"] == "1/2"
    assert float(cells["ttft_ms_p50"]) > 0                  # the request that completed is measured
    assert "run 1 (lazy): 1 of 2 requests failed; the first:" in p.stderr
    assert "NaN/Inf logits" in p.stderr


@no_cuda
@pytest.mark.parametrize("name", ["clip_search_bench", "k1_read_floor", "launch_floor", "skinny_gemm_bench",
                                  "gemv_fold_bench", "sparse_decode_bench", "w8a16_bench"])
def test_gpu_only_scripts_say_they_need_cuda_in_one_line(name):
    pytest.importorskip("triton")                   # most import their kernels before reading any option
    p = script([f"benchmarks/{name}.py"])
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [f"{name}.py: needs a CUDA GPU"]


@pytest.mark.parametrize("option", ["--context", "--tokens", "--rounds", "--threads"])
def test_cpu_fp8_kv_decode_refuses_sizes_below_1_in_one_line(option):
    p = script(["benchmarks/cpu_fp8_kv_decode.py", option, "0"])
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [f"cpu_fp8_kv_decode.py: {option} must be at least 1, got 0"]
