"""The analytic memory model against hand-computed numbers for the real MiniCPM-SALA config
(reference/architecture.md §5), and `salactl report memory` through the real CLI."""

import json
import re
import subprocess
import sys

import pytest
import torch

from conftest import run_cli
from salactl.errors import CheckpointError, ConfigError, UsageError
from salactl.reports import memory as mem
from salactl.reports.memory_report import MemoryQuery, build, gpu_list
from salactl.runtime.gpu.pools import slot_bytes
from salactl.runtime.peaks import DATASHEET
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.presets import preset, sala_9b

CFG = sala_9b()
PARAMS = 9_477_203_968


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True, timeout=120)


def test_bf16_weight_bytes_are_params_times_two():
    w = mem.weight_bytes(CFG, "bf16")
    assert w.params == PARAMS
    assert w.total == PARAMS * 2 == 18_954_407_936


def test_w4a16_weight_bytes_by_part():
    # quantized linears: per sparse layer q,o,o_gate 4096x4096, k,v 256x4096, gate/up/down 4096x16384
    sparse = 3 * 4096 * 4096 + 2 * 256 * 4096 + 3 * 4096 * 16384      # 253,755,392
    light = 5 * 4096 * 4096 + 3 * 4096 * 16384                         # 285,212,672
    q = 8 * sparse + 24 * light
    assert q == 8_875_147_264
    k_sum = 32 * (7 * 4096 + 16384)          # Σ in_features over a layer's 8 linears (both kinds)
    plain = 2 * 73448 * 4096 + 32 * 2 * 4096 + 24 * (128 + 128 + 4096) + 4096
    assert q + plain == PARAMS
    w = mem.weight_bytes(CFG, "w4a16", group_size=128)
    assert w.by_part == {"qweight": q // 2, "qzeros": q // 256, "scales": q // 64, "g_idx": 4 * k_sum,
                         "bf16": 2 * plain}
    assert w.total == 5_820_796_928
    w8 = mem.weight_bytes(CFG, "w8a16", group_size=128)
    assert w8.by_part == {"qweight": q, "qzeros": q // 128, "scales": q // 64, "g_idx": 4 * k_sum,
                          "bf16": 2 * plain}


def test_kv_cache_per_token_and_gla_state():
    assert mem.kv_bytes_per_token(CFG, "bf16") == 8 * 1024          # 8 layers x K,V x 2 heads x 128 x 2 B
    assert mem.kv_bytes_per_token(CFG, "fp8_e4m3") == 4 * 1024
    assert mem.kv_bytes_per_token(CFG, "bf16", layers=32) == 32 * 1024
    assert slot_bytes(CFG) == 48 * 1024 * 1024            # 24 x 32 x 128 x 128 x 4 B


def test_request_memory_at_128k():
    r = mem.request_memory(CFG, 131072, "bf16")
    assert r.kv_cache == 131072 * 8192
    per_window = 8 * 2 * 128 * 2                                      # layers x KV heads x d x bf16
    assert r.compressed_k1 == 2048 * 4 * per_window == 8192 * 4096    # 2048 pages of 4 K1 slots
    assert r.compressed_k2 == ((131072 - 128) // 64 + 1) * per_window == 2047 * 4096
    assert r.total == r.kv_cache + r.compressed_k1 + r.gla_state       # our runtime keeps K1 only
    sg = mem.request_memory(CFG, 131072, "bf16", compressed_keys="k1k2")
    assert sg.total == r.total + r.compressed_k2
    assert mem.full_attention_request(CFG, 131072) == 131072 * 32 * 1024
    one_page = mem.request_memory(CFG, 16)                           # a whole 64-token page, as the engine holds it
    assert (one_page.kv_cache, one_page.compressed_k1, one_page.compressed_k2) == (64 * 8192, 4 * per_window, 0)
    assert mem.request_memory(CFG, 1000).kv_cache == 16 * 64 * 8192


def test_request_memory_matches_the_gpu_engines_page_pool():
    from salactl.runtime.gpu.pools import page_bytes

    for cfg in (CFG, NANO):
        for context in (1, 100, 1000, 4096, 131072 + 5):
            pages = -(-context // cfg.sparse_config.block_size)
            for kv, itemsize in (("bf16", 2), ("fp8_e4m3", 1)):
                r = mem.request_memory(cfg, context, kv)
                assert r.kv_cache + r.compressed_k1 == pages * page_bytes(cfg, itemsize, 2), (context, kv)


def test_max_concurrent_and_gpu_table():
    assert mem.max_concurrent(100, 0.9, 50, 10) == 4
    assert mem.max_concurrent(100, 0.9, 95, 10) == 0
    assert set(mem.GPU_NAMES) <= set(DATASHEET)
    # nvidia-smi's memory.total (MiB), not the datasheet's GB read as 10^9 bytes
    assert mem.gpu_memory("NVIDIA H200") == (143771 * 2**20, "nvidia-smi")
    assert mem.gpu_memory("NVIDIA H100 80GB HBM3") == (81559 * 2**20, "nvidia-smi")
    # the most specific name wins: the SOAR card is not the 96 GB RTX PRO 6000, a GH200 not an H200
    assert mem.gpu_memory("NVIDIA RTX PRO 6000D") == (84 * 10**9, "datasheet")
    assert mem.gpu_memory("NVIDIA RTX PRO 6000 Blackwell Server Edition") == (97887 * 2**20, "nvidia-smi")
    assert mem.gpu_memory("NVIDIA GH200 480GB") == (97871 * 2**20, "nvidia-smi")
    # an 80 GB A100 under any spelling is not the 40 GB part the bare "A100" names
    for name in ("A100 80GB", "A100-80GB", "a100_80gb", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"):
        assert mem.gpu_memory(name) == (81920 * 2**20, "nvidia-smi"), name
    assert mem.gpu_memory("NVIDIA A100-PCIE-40GB") == (40960 * 2**20, "nvidia-smi")
    assert mem.gpu_memory("NVIDIA H100 NVL") == (95830 * 2**20, "nvidia-smi")
    assert mem.gpu_memory("NVIDIA A100-SXM4-40GB") == (40960 * 2**20, "nvidia-smi")


def test_datasheet_ceilings_match_the_most_specific_name_and_hold_fp32_rates(tmp_path, monkeypatch):
    from salactl.runtime.peaks import peaks_by_name

    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))      # no measured ceilings

    assert peaks_by_name("NVIDIA H100 NVL", "cuda").mem_gbps == 3900.0
    assert peaks_by_name("NVIDIA GH200 480GB", "cuda").mem_gbps == 4000.0
    assert peaks_by_name("NVIDIA H200", "cuda").mem_gbps == 4800.0
    h100 = peaks_by_name("NVIDIA H100 80GB HBM3", "cuda")
    # without TF32 a float32 model's GEMMs run on the CUDA cores: its floor is not the tensor cores'
    assert h100.matmul_tflops(torch.float32) == (67.0, "fp32")
    assert h100.matmul_tflops(torch.bfloat16) == (989.0, "bf16")
    assert peaks_by_name("NVIDIA RTX PRO 6000D", "cuda").matmul_tflops(torch.float32) == (148.0, "bf16")
    with pytest.raises(UsageError, match="--gpu-mem"):
        mem.gpu_memory("Voodoo 5")
    with pytest.raises(UsageError, match="fp8_e4m3"):
        mem.kv_bytes_per_elem("int3")


def test_every_kv_dtype_name_keeps_its_bytes():
    from salactl.runtime.kv_fp8 import KV_CACHE_DTYPES

    before = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "auto": 2,
              "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8": 1, "fp32": 4, "float32": 4}
    assert {name: mem.kv_bytes_per_elem(name) for name in before} == before == mem.KV_DTYPE_BYTES
    assert set(KV_CACHE_DTYPES) | set(mem.PLANNING_ONLY_KV_BYTES) == set(before)
    assert not set(KV_CACHE_DTYPES) & set(mem.PLANNING_ONLY_KV_BYTES)


def test_cli_memory_help_names_the_kv_dtypes_and_which_are_planning_only():
    import typer

    from salactl.cmd_report import report_app
    from salactl.runtime.kv_fp8 import KV_CACHE_DTYPES

    memory = typer.main.get_command(report_app).commands["memory"]
    (opt,) = [p for p in memory.params if p.name == "kv_cache_dtype"]
    engine, planning = opt.help.split("planning only:")
    assert re.findall(r"\w+", planning) == list(mem.PLANNING_ONLY_KV_BYTES)
    assert set(KV_CACHE_DTYPES) <= set(re.findall(r"\w+", engine))


def test_cli_memory_unknown_kv_dtype_lists_every_valid_name(monkeypatch, capsys):
    valid = ("valid: auto, bf16, fp8_e4m3, fp8_e5m2, or for planning only: bfloat16, fp16, float16, "
             "fp32, float32, fp8")
    assert_usage_errors(monkeypatch, capsys,
                        [(["--kv-cache-dtype", "bf16,int3"], f"'int3'; {valid}")])


def per_request_columns(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("per request"))
    header = next(line for line in lines[start:] if line.startswith("┃"))
    return [c.strip() for c in header.strip("┃").split("┃")]


def test_cli_memory_shows_k2_only_where_it_is_counted(capsys):
    args = ["report", "memory", "--model", "sala-9b", "--context", "4096",
            "--kv-cache-dtype", "bf16", "--weights", "bf16"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert per_request_columns(out) == ["KV dtype", "context", "KV cache", "K1", "GLA state",
                                        "total", "full attention KV"]
    code, out, err = run_cli([*args, "--compressed-keys", "k1k2"], capsys)
    assert code == 0, err
    assert per_request_columns(out) == ["KV dtype", "context", "KV cache", "K1", "K2", "GLA state",
                                        "total", "full attention KV"]
    for kept in ("k1", "k1k2"):                  # the JSON keeps K2's size in both modes
        code, out, err = run_cli([*args, "--compressed-keys", kept, "--json"], capsys)
        (row,) = json.loads(out)["per_request"]
        assert code == 0 and row["compressed_k2"] > 0 and row["compressed_keys_kept"] == kept


def test_build_concurrency_vs_full_attention_and_measured_rows():
    q = MemoryQuery(contexts=(131072,), kv_dtypes=("bf16",), weights=("bf16",), gpus=gpu_list(None, 80.0),
                    cuda_graphs=False, prefill_chunk=8192)
    rec = {"schema_version": 1, "kind": "run", "label": "x", "phase": "decode", "peak_memory_bytes": 25e9,
           "knobs": {"context": 131072, "batch": 2, "weights": "bf16", "kv_cache_dtype": "bf16"}}
    r = build(CFG, q, [rec])
    fixed = r["server"]["bf16"]["fixed"]
    assert fixed == PARAMS * 2 + mem.prefill_workspace_bytes(CFG, 8192) + mem.CUDA_CONTEXT_ESTIMATE
    per_req = 131072 * 8192 + 8192 * 4096 + 48 * 2**20              # 2048 pages: KV + 4 K1 slots each
    (c,) = r["concurrency"]
    assert c["max_requests"] == int((80e9 * 0.9 - fixed) // per_req)
    assert c["max_requests_full_attention"] == int((80e9 * 0.9 - fixed) // (131072 * 32 * 1024))
    (m,) = r["measured"]
    predicted = PARAMS * 2 + mem.prefill_workspace_bytes(CFG, 8192) + 2 * per_req
    assert m["predicted"] == predicted and m["ratio"] == pytest.approx(25e9 / predicted)


def test_cli_memory_json():
    p = salactl("report", "memory", "--model", "sala-9b", "--context", "4096,131072", "--gpu", "H200",
                "--kv-cache-dtype", "bf16,fp8_e4m3", "--weights", "bf16", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["kv_bytes_per_token"] == {"bf16": 8192, "fp8_e4m3": 4096}
    assert d["server"]["bf16"]["weights"]["total"] == PARAMS * 2
    assert [x["gla_state"] for x in d["per_request"]] == [48 * 2**20] * 4
    assert len(d["concurrency"]) == 4


def assert_usage_errors(monkeypatch, capsys, cases):
    from salactl.cli import main

    for args, needle in cases:
        monkeypatch.setattr(sys, "argv", ["salactl", "report", "memory", "--model", "sala-9b", *args])
        with pytest.raises(SystemExit) as e:
            main()
        err = capsys.readouterr().err
        assert e.value.code == UsageError.exit_code and needle in err and err.count("\n") == 1, (args, err)


def test_cli_memory_bad_input_is_one_line(monkeypatch, capsys):
    assert_usage_errors(monkeypatch, capsys, (
        (["--gpu", "Voodoo 5"], "--gpu-mem"), (["--context", "4096,x"], "--context"),
        (["--context", "0"], "positive"), (["--mem-fraction", "1.5"], "--mem-fraction"),
        (["--gpu", "H200", "--gpu-mem", "80"], "not both")))


def test_cli_memory_non_finite_gpu_mem_is_a_usage_error(monkeypatch, capsys):
    assert_usage_errors(monkeypatch, capsys, [(["--gpu-mem", v], "--gpu-mem must be a positive finite number of GB")
                                              for v in ("nan", "inf", "-inf", "1e300", "0")])


def test_cli_memory_empty_lists_are_usage_errors(monkeypatch, capsys):
    assert_usage_errors(monkeypatch, capsys, (
        (["--kv-cache-dtype", ""], "--kv-cache-dtype"), (["--kv-cache-dtype", " , "], "--kv-cache-dtype"),
        (["--weights", ","], "--weights"), (["--weights", ""], "--weights"),
        (["--context", ","], "--context"), (["--context", ""], "--context"),
        (["--gpu", ""], "--gpu"), (["--gpu", ","], "--gpu")))


def test_cli_memory_missing_model_is_a_checkpoint_error_as_in_run(tmp_path):
    for cmd in (["report", "memory"], ["run", "--prompt", "hi"]):
        p = salactl(*cmd, "--model", str(tmp_path / "nope"))
        assert p.returncode == CheckpointError.exit_code and "preset" in p.stderr, (cmd, p.stderr)
        assert p.stderr.strip().count("\n") == 0
    (tmp_path / "empty").mkdir()
    p = salactl("report", "memory", "--model", str(tmp_path / "empty"))
    assert p.returncode == ConfigError.exit_code and "config.json" in p.stderr


def test_cli_memory_weights_beyond_the_gpu_are_explained():
    p = salactl("report", "memory", "--model", "sala-9b", "--gpu-mem", "16", "--context", "4096",
                "--kv-cache-dtype", "bf16", "--weights", "bf16,w4a16", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["weights_exceed_memory"] == [{"gpu": "16 GB", "weights": "bf16", "weights_bytes": PARAMS * 2,
                                           "usable_bytes": int(16e9 * 0.9)}]
    assert [x["max_requests"] for x in d["concurrency"] if x["weights"] == "bf16"] == [0]
    assert d["fixed_exceeds_memory"] == [{"gpu": "16 GB", "weights": "bf16", "exceeded_by": "weights",
                                          "fixed_bytes": d["server"]["bf16"]["fixed"],
                                          "usable_bytes": int(16e9 * 0.9)}]
    (note,) = [line for line in p.stderr.splitlines() if line.startswith("note:")]
    assert "bf16 weights (17.7 GiB) exceed the usable memory" in note and "(13.4 GiB at" in note  # GiB as tables
    assert "w4a16" not in p.stderr


def test_cli_memory_fixed_total_beyond_the_gpu_is_explained():
    """bf16 weights (17.7 GiB) fit in 22 GB x 0.9 (18.4 GiB), weights + workspace do not."""
    p = salactl("report", "memory", "--model", "sala-9b", "--gpu-mem", "22", "--context", "4096",
                "--kv-cache-dtype", "bf16", "--weights", "bf16,w4a16", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["weights_exceed_memory"] == []
    assert d["fixed_exceeds_memory"] == [{"gpu": "22 GB", "weights": "bf16", "exceeded_by": "workspace_estimate",
                                          "fixed_bytes": d["server"]["bf16"]["fixed"],
                                          "usable_bytes": int(22e9 * 0.9)}]
    assert [x["max_requests"] for x in d["concurrency"] if x["weights"] == "bf16"] == [0]
    (note,) = [line for line in p.stderr.splitlines() if line.startswith("note:")]
    assert "bf16 server's fixed total (19.0 GiB = weights 17.7 GiB + workspace" in note and "18.4 GiB" in note
    assert "once the workspace (est.) is added" in note
    assert "w4a16" not in note and " GB)" not in note


NANO = preset("sala-nano")


def run_record(phase="decode", **knobs):
    """A record as `salactl run --out` writes it (salactl/run_job.py), with a measured peak."""
    return {"schema_version": 1, "kind": "run", "run_id": "r", "label": None, "profile": "run", "phase": phase,
            "target": "embedded", "model": str(EMBEDDED_DIR), "completed": 1, "failed": 0,
            "total_input_tokens": 100, "total_output_tokens": 28, "peak_memory_bytes": 60_000_000,
            "floor_s": 0.001, "time_over_floor": 3.0,
            "knobs": {"model": "sala-nano", "random_weights": False, "dtype": "bfloat16", "max_new_tokens": 28,
                      "chunk_size": 64, "kv_cache_dtype": "bfloat16", **knobs}}


def test_measured_rows_of_run_records_use_their_tokens_dtype_and_checkpoint(tmp_path):
    q = MemoryQuery(contexts=(4096,))
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    cfg = json.loads((EMBEDDED_DIR / "config.json").read_text())
    (gptq / "config.json").write_text(json.dumps({**cfg, "quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True}}))
    recs = [run_record(), run_record(dtype="float32", kv_cache_dtype="float32"),
            {**run_record(), "model": str(gptq)}, run_record(kv_cache_dtype="fp8_e4m3"),
            {**run_record(), "model": str(tmp_path / "gone")}, run_record(dtype=None)]
    rows = build(NANO, q, recs)["measured"]
    assert [(r["context"], r["batch"], r["weights"], r["kv_dtype"]) for r in rows] == [
        (128, 1, "bf16", "bfloat16"), (128, 1, "fp32", "float32"), (128, 1, "w4a16", "bfloat16"),
        (128, 1, "bf16", "fp8_e4m3"), (128, 1, "unknown", "bfloat16"), (128, 1, "unknown", "bfloat16")]

    def predicted(weights, act, kv, group=128):
        return (mem.weight_bytes(NANO, weights, group, act).total + mem.prefill_workspace_bytes(NANO, 64, act)
                + mem.request_memory(NANO, 128, kv, key_bytes=act).total)

    assert [r["predicted"] for r in rows] == [
        predicted("bf16", 2, "bf16"), predicted("bf16", 4, "float32"), predicted("w4a16", 2, "bf16", 32),
        predicted("bf16", 2, "fp8_e4m3"), None, None]
    assert rows[1]["predicted"] > 1.9 * rows[0]["predicted"]        # fp32 weights, KV and workspace
    assert rows[2]["predicted"] < rows[0]["predicted"]
    assert rows[0]["ratio"] == pytest.approx(60e6 / rows[0]["predicted"]) and rows[4]["ratio"] is None
    (b,) = build(NANO, q, [run_record(batch_size=4, random_weights=True)])["measured"]
    assert b["batch"] == 4 and b["weights"] == "bf16"


def test_cli_memory_predicts_peaks_of_real_run_records(tmp_path):
    out = tmp_path / "runs"
    p = salactl("run", "-p", "hi", "-n", "3", "--device", "cpu", "--out", str(out))   # fp32 weights and KV
    assert p.returncode == 0, p.stderr
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    f = tmp_path / "peaks.jsonl"
    f.write_text("".join(json.dumps({**r, "peak_memory_bytes": 50_000_000}) + "\n" for r in recs))
    p = salactl("report", "memory", "--records", str(f), "--gpu-mem", "80", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["measured"]
    assert [r["phase"] for r in rows] == ["prefill", "decode"]
    n = recs[0]["total_input_tokens"] + recs[0]["total_output_tokens"]
    for r in rows:
        assert r["context"] == n and r["batch"] == 1 and r["weights"] == "fp32" and r["kv_dtype"] == "float32"
        assert r["predicted"] > 0 and r["ratio"] == pytest.approx(50e6 / r["predicted"])
    p = salactl("report", "memory", "--records", str(f), "--gpu-mem", "80")
    assert p.returncode == 0 and "measured peaks vs analytic" in p.stdout and "fp32" in p.stdout


def test_cli_memory_warns_past_max_position_embeddings():
    p = salactl("report", "memory", "--model", "sala-9b", "--context", "4096,1048576", "--gpu", "H200",
                "--kv-cache-dtype", "bf16", "--weights", "bf16", "--json")
    assert p.returncode == 0, p.stderr
    assert [x["context"] for x in json.loads(p.stdout)["per_request"]] == [4096, 1048576]   # kept
    (warning,) = p.stderr.strip().splitlines()
    assert warning.startswith("warning: --context is 1,048,576 tokens") and "(524,288)" in warning
    p = salactl("report", "memory", "--model", "sala-9b", "--context", "524288", "--json")
    assert p.returncode == 0 and p.stderr == ""
    p = salactl("report", "memory", "--json")      # sala-nano (65,536) with the default contexts
    assert p.returncode == 0 and "warning" not in p.stderr


def test_bench_records_peak_key_gives_a_measured_row():
    q = MemoryQuery(contexts=(4096,), kv_dtypes=("bf16",), weights=("bf16",), gpus=gpu_list(None, 80.0),
                    cuda_graphs=False, prefill_chunk=8192)
    rec = {"schema_version": 1, "kind": "bench", "label": "b", "phase": "S1", "peak_gpu_memory_bytes": 3e10,
           "knobs": {"input_len": 4096, "weights": "bf16", "kv_cache_dtype": "bf16", "max_concurrency": 2}}
    (m,) = build(CFG, q, [rec])["measured"]
    assert m["measured_peak"] == 3e10 and m["context"] == 4096 and m["batch"] == 2 and m["predicted"] > 0
    rec["knobs"]["output_len"] = 256                   # a sweep's point: its peak holds the output's KV too
    (m2,) = build(CFG, q, [rec])["measured"]
    assert m2["context"] == 4096 + 256 and m2["predicted"] > m["predicted"]


def test_report_memory_takes_the_checkpoints_gptq_group(tmp_path, capsys):
    from safetensors import safe_open

    ckpt = tmp_path / "g32"
    code, _, err = run_cli(["quantize", "--model", "sala-nano", "--out", ckpt, "--group-size", "32",
                            "--method", "rtn"], capsys)
    assert code == 0, err
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        on_disk = {p: sum(f.get_tensor(k).nbytes for k in f.keys() if k.endswith("." + p))
                   for p in ("qweight", "qzeros", "scales", "g_idx")}

    def reported(*extra):
        code, out, err = run_cli(["report", "memory", "--model", ckpt, "--weights", "w4a16", "--context", "4096",
                                  "--gpu-mem", "1", "--json", *extra], capsys)
        assert code == 0, err
        return {p: v for p, v in json.loads(out)["server"]["w4a16"]["weights"]["by_part"].items() if p in on_disk}

    assert reported() == on_disk                               # group 32 from its quantization_config
    assert reported("--group-size", "128")["scales"] == on_disk["scales"] // 4
    code, out, err = run_cli(["report", "memory", "--group-size", "16"], capsys)
    assert code == 2 and "--group-size must be one of -1, 32, 64, 128" in err


@pytest.mark.parametrize("args, named", [
    (["--weights", "bf16", "--group-size", "32"], "--group-size"),     # no GPTQ rows
    (["--no-cuda-graphs", "--max-batch", "4"], "--max-batch"),         # no CUDA-graph pool
])
def test_memory_options_that_would_be_ignored_are_usage_errors(args, named, capsys):
    code, out, err = run_cli(["report", "memory", *args], capsys)
    assert code == UsageError.exit_code and out == "", err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {named} applies to"), line


def test_records_without_measured_peaks_are_named_in_a_note(tmp_path, capsys):
    code, _, err = run_cli(["run", "--prompt-ids", "1,2", "-n", 2, "--device", "cpu", "--out", tmp_path], capsys)
    assert code == 0, err                                      # a CPU run records no allocator peak
    code, out, err = run_cli(["report", "memory", "--records", tmp_path / "records.jsonl", "--gpu-mem", "80",
                              "--json"], capsys)
    assert code == 0 and json.loads(out)["measured"] == []
    assert "note: none of the 2 records has a measured peak" in err


def test_default_gpus_are_the_ones_the_help_names(capsys):
    from salactl.cmd_report import DEFAULT_GPUS

    code, out, err = run_cli(["report", "memory", "--json"], capsys)
    assert code == 0, err
    assert list(dict.fromkeys(x["gpu"] for x in json.loads(out)["concurrency"])) == DEFAULT_GPUS.split(",")
    code, out, _ = run_cli(["report", "memory", "--help"], capsys)
    assert "(" + DEFAULT_GPUS.replace(" ", "") + ")" in "".join(out.split())
