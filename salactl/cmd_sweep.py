"""`salactl sweep`: grids over sparse-attention, chunked-prefill, batch, KV and weight dtype knobs;
each point measured for speed, memory and accuracy proxies; table, JSONL records, Pareto plot."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from salactl import input_files, out_dirs, output
from salactl.options import (DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, RandomWeightsOpt, TokenizerOpt, non_empty_path,
                             seed_option)

ListOpt = lambda flag, help: typer.Option(flag, help=help)  # noqa: E731


def sweep(
    model: ModelOpt = "sala-nano",
    random_weights: RandomWeightsOpt = False,
    seed: seed_option("--random-weights, the KL prompt, the passkeys and the requests' lengths and ids") = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    tokenizer: TokenizerOpt = None,
    dense_len: Annotated[Optional[str], ListOpt("--dense-len", "sparse_config.dense_len values, e.g. 256,1024 (default: the model's sparse_config).")] = None,
    topk: Annotated[Optional[str], ListOpt("--topk", "sparse_config.topk values (default: the model's sparse_config).")] = None,
    window: Annotated[Optional[str], ListOpt("--window", "sparse_config.window_size values, multiples of the block (default: the model's sparse_config).")] = None,
    block: Annotated[Optional[str], ListOpt("--block", "sparse_config.block_size values, multiples of kernel_stride (default: the model's sparse_config).")] = None,
    chunk_size: Annotated[Optional[str], ListOpt("--chunk-size", "Prefill chunk sizes (default 8192 on the GPU engine, 512 on the reference).")] = None,
    batch_size: Annotated[Optional[str], ListOpt("--batch-size", "Requests in flight (default 1, the only one the reference engine takes).")] = None,
    kv_dtype: Annotated[Optional[str], typer.Option("--kv-cache-dtype", "--kv-dtype", help="KV cache dtypes: bf16 or auto (the default: stores the activation dtype), fp8_e5m2, fp8_e4m3 (calibrated scales).")] = None,
    weight_dtype: Annotated[Optional[str], typer.Option("--weight-dtype", "--weights", help="bf16, fp16, fp32 (or bfloat16, float16, float32): the whole model cast (weights, activations and KV cache); w4a16, w8a16: weights RTN group 128 in memory, activations in the model's dtype. Default: the model's dtype (--dtype), or a GPTQ checkpoint's format.")] = None,
    input_len: Annotated[int, typer.Option("--input-len", help="Prompt tokens of the speed workload.")] = 512,
    output_len: Annotated[int, typer.Option("--output-len", help="Output tokens of the speed workload.")] = 16,
    requests: Annotated[int, typer.Option("--requests", help="Timed requests per point, raised to the point's batch size.")] = 2,
    kl: Annotated[bool, typer.Option("--kl/--no-kl", help="Logit KL vs dense attention. The accuracy proxies (KL, passkey) run each point's knobs on the reference engine, also where the speed comes from the GPU engine (CUDA); a point whose KL prompt ends before its dense_len, while its speed prompts do not, is left off the Pareto front.")] = True,
    kl_len: Annotated[Optional[int], typer.Option("--kl-len", help="KL prompt tokens (default --input-len; not with --no-kl).")] = None,
    passkey: Annotated[bool, typer.Option("--passkey/--no-passkey", help="Passkey retrieval accuracy.")] = True,
    passkey_lengths: Annotated[Optional[str], typer.Option("--passkey-lengths", help="Passkey prompt lengths in tokens (comma list; default 512; not with --no-passkey).")] = None,
    passkey_depths: Annotated[Optional[str], typer.Option("--passkey-depths", help="Where the key sits, as fractions of the prompt (comma list in [0, 1]; default 0.25,0.75; not with --no-passkey).")] = None,
    passkey_trials: Annotated[Optional[int], typer.Option("--passkey-trials", help="Prompts per length and depth (default 2; not with --no-passkey).")] = None,
    engine: Annotated[str, typer.Option("--engine", help="auto, reference or gpu.")] = "auto",
    max_running_requests: Annotated[Optional[int], typer.Option("--max-running-requests", help="GPU engine: requests batched at once (default 64); refused on the reference engine, which runs one.")] = None,
    mem_fraction: Annotated[Optional[float], typer.Option("--mem-fraction", help="GPU engine: share of the GPU memory still free once the weights are loaded that its KV/state caches and prefill workspace take, in (0, 1] (default 0.9). Refused on the reference engine.")] = None,
    pareto_x: Annotated[Optional[str], typer.Option("--pareto-x", help="Latency axis of the front: e2e, ttft or tpot (default e2e; not with --no-kl).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", metavar="<path>", parser=non_empty_path("--out", "a directory"), help="Directory for records.jsonl and the plot.")] = Path("salactl-results/sweep"),
    resume: Annotated[bool, typer.Option("--resume", help="Skip points already recorded in --out under the same --label (another --label measures them again).")] = False,
    label: Annotated[Optional[str], typer.Option("--label", help="A name for this sweep in the records.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Sweep runtime knobs; measure TTFT, TPOT, throughput, memory (on --engine), logit KL and passkey (on the reference engine) per point."""
    from salactl.bench.live import PointProgress
    from salactl.bench.sweep_job import SweepSettings, run_sweep

    out_dirs.directory_option(out, files=("records.jsonl",))
    label = None if label is None else input_files.utf8_text(label)
    s = SweepSettings(model=model, random_weights=random_weights, seed=seed, device=device, dtype=dtype,
                      tokenizer=tokenizer, dense_len=dense_len, topk=topk, window=window, block=block,
                      chunk_size=chunk_size, batch_size=batch_size, kv_dtype=kv_dtype,
                      weight_dtype=weight_dtype, input_len=input_len, output_len=output_len,
                      requests=requests, kl=kl, kl_len=kl_len, passkey=passkey,
                      passkey_lengths=passkey_lengths, passkey_depths=passkey_depths,
                      passkey_trials=passkey_trials, engine=engine,
                      max_running_requests=max_running_requests, mem_fraction=mem_fraction, out=out, resume=resume, label=label,
                      pareto_x=pareto_x)
    run = run_sweep(s, PointProgress()).to_dict()
    if json_out:
        output.print_json(run)
        return
    cols, rows = table_rows(run)
    output.table(f"sweep {run['run_id']}", cols, rows)      # the notes were said as they arose
    output.stdout.print(f"records: {run['files']['records']}"
                        + (f"  plot: {run['files']['pareto_plot']}" if "pareto_plot" in run["files"] else ""))


def table_rows(run: dict) -> tuple[list[str], list[list]]:
    """The sweep table's columns and a row per point; "cache pool MiB" (the GPU engine's caches, sized
    from the free memory: most of its peak) where a point has one."""
    pool = any(p.get("cache_pool_bytes") for p in run["points"])
    cols = ["point", "failed", "TTFT ms", "TPOT ms", "out tok/s", "cache MiB", "GPU peak MiB",
            *(["cache pool MiB"] if pool else []), "KL", "KL sparse", "top-1", "passkey", "front"]
    front = set(run["pareto_point_keys"])      # by key: a point's name says only the knobs that vary in this sweep
    rows = [[p["phase"], p.get("failed"), p.get("mean_ttft_ms"), p.get("mean_tpot_ms"), p.get("output_throughput"),
             _mib(p.get("cache_bytes_per_request")), _mib(p.get("peak_gpu_memory_bytes")),
             *([_mib(p.get("cache_pool_bytes"))] if pool else []),
             p.get("logit_kl_mean"), p.get("logit_kl_sparse_mean"), p.get("top1_agreement"),
             p.get("passkey_accuracy"), "*" if p.get("point_key") in front else ""] for p in run["points"]]
    return cols, rows


def _mib(v) -> float | None:
    """Bytes as MiB; None for none, 0 or a value that is no finite number (a --resume'd record edited by hand)."""
    from salactl.reports.records import is_finite_number

    return v / 2**20 if is_finite_number(v) and v else None


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
