"""`salactl profile`: profile one prefill and/or decode step with NVTX ranges per layer and op,
under Nsight Compute (--ncu), torch.profiler (--torch) and/or NVML sampling (--nvml); print per
op, per layer and per kernel time, DRAM bytes, bandwidth, FLOP rate and % of peak next to the
analytic roofline."""

from __future__ import annotations

import stat
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from salactl import output
from salactl.units import human_bytes
from salactl.errors import UsageError
from salactl.options import (DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, RandomWeightsOpt, non_empty, non_empty_path,
                             passed, refuse_unused, seed_option)
from salactl.profiling.spec import MAX_WARMUP


def profile(
    ctx: typer.Context,
    phase: Annotated[str, typer.Option("--phase", help="prefill, decode or both.")] = "decode",
    batch: Annotated[int, typer.Option("--batch", help="Sequences in the step.")] = 1,
    context: Annotated[int, typer.Option("--context", help="Cached tokens before the decode step; "
                                         "prompt length for prefill.")] = 4096,
    chunk_size: Annotated[int, typer.Option("--chunk-size", help="Prefill only: tokens in the profiled "
                                            "chunk, which ends the --context-token prompt (the rest "
                                            "is cached before it); at most --context.")] = 512,
    model: ModelOpt = "sala-nano",
    random_weights: RandomWeightsOpt = False,
    seed: seed_option("--random-weights and the random cached context and step tokens") = 0,
    weights: Annotated[str, typer.Option("--weights", help="auto (a GPTQ checkpoint's own format, else "
                                         "unquantized in --dtype), bf16, fp16 or fp32 (the whole model in that "
                                         "dtype; sets --dtype), w4a16 or w8a16 (RTN g128 in memory, activations "
                                         "in --dtype; a GPTQ checkpoint takes only its own).")] = "auto",
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="auto or bf16 (the model's dtype), "
                                                "fp8_e4m3 or fp8_e5m2 (the checkpoint's calibrated scales, "
                                                "else 1.0: scales do not change the work).")] = "auto",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    backend: Annotated[str, typer.Option("--backend", help="engine (the GPU engine: fused model, "
                       "paged caches), reference (plain PyTorch) or auto (engine on CUDA).")] = "auto",
    ncu: Annotated[bool, typer.Option("--ncu", help="Nsight Compute hardware counters (already the default "
                                      "on a GPU where ncu is found).")] = False,
    torch_mode: Annotated[bool, typer.Option("--torch", help="torch.profiler (no counters; "
                                             "default without ncu or GPU).")] = False,
    nvml: Annotated[bool, typer.Option("--nvml", help="Sample memory, power, clocks, throttling.")] = False,
    ncu_path: Annotated[Optional[str], typer.Option("--ncu-path", parser=non_empty("--ncu-path", "the ncu executable"), help="The ncu executable (Nsight Compute "
                                         "profiles: --ncu, or auto on a GPU; with --import, the one that "
                                         "exports a saved profile.ncu-rep).")] = None,
    launch_skip: Annotated[int, typer.Option("--launch-skip", help="ncu: kernels to skip in the "
                                             "ranges.")] = 0,
    launch_count: Annotated[Optional[int], typer.Option("--launch-count", help="ncu: kernels to "
                                                        "profile (default: all in the step).")] = None,
    layers: Annotated[Optional[str], typer.Option("--layers", help="Profile only these layers "
                                                  "(and lm_head), e.g. 1,9,lm_head.")] = None,
    ncu_metrics: Annotated[str, typer.Option("--ncu-metrics", help="bytes (time, DRAM; fast) or sol "
                                             "(+ SM/memory % of peak; ~10 passes per kernel).")] = "bytes",
    warmup: Annotated[int, typer.Option("--warmup", help="Unprofiled steps before the profiled one, "
                                        f"0..{MAX_WARMUP}.")] = 1,
    top: Annotated[int, typer.Option("--top", help="Kernel rows to show (>= 1).")] = 20,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="<path>", parser=non_empty_path("--out", "a directory"), show_default="salactl-profile-<timestamp>", help="Directory for the report files.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a profile already in --out.")] = False,
    import_dir: Annotated[Optional[Path], typer.Option("--import", metavar="<path>", parser=non_empty_path("--import", "a directory written by salactl profile --ncu"), help="Re-render a saved --ncu "
                                                       "profile directory (only --top, --json and --ncu-path "
                                                       "apply).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Profile a prefill/decode step per layer and op against the analytic roofline."""
    from salactl.profiling.ncu_runner import NcuOptions
    from salactl.profiling.session import OUTPUT_FILES, SessionOptions, load_saved, run
    from salactl.profiling.spec import ProfileSpec, parse_layers
    from salactl.reports.atomic import check_out_dir

    if top < 1:
        raise UsageError(f"--top must be >= 1 (kernel rows to show), got {top}")
    if import_dir is not None:
        refuse_unused(passed(ctx, *(p.name for p in ctx.command.params if p.name not in IMPORT_OPTIONS)),
                      "new profiles only (--import re-renders a saved one; --top, --json and --ncu-path apply)",
                      "drop {it}")
        _check_import_dir(import_dir)
        result = load_saved(import_dir, top, ncu_path)
    else:
        if ncu and torch_mode:
            raise UsageError("give at most one of --ncu and --torch")
        phases = ("prefill", "decode") if phase == "both" else (phase,)
        if phase == "decode":
            refuse_unused(passed(ctx, "chunk_size"), "the prefill step only", "add --phase prefill or both, or drop {it}")
        layer_ids, head = parse_layers(layers)
        spec = ProfileSpec(model=model, random_weights=random_weights, seed=seed, phases=phases,
                           batch=batch, context=context, chunk_size=chunk_size, weights=weights,
                           kv_cache_dtype=kv_cache_dtype, device=device, dtype=dtype, warmup=warmup,
                           layers=layer_ids, lm_head=head, backend=backend)
        if launch_skip < 0 or (launch_count is not None and launch_count <= 0):
            raise UsageError("--launch-skip must be >= 0 and --launch-count positive")
        mode = "ncu" if ncu else "torch" if torch_mode else "auto"
        out_dir = check_out_dir(out or Path(f"salactl-profile-{time.strftime('%Y%m%d-%H%M%S')}"),
                                OUTPUT_FILES, overwrite)
        spec = spec.with_checkpoint_weights()       # --weights auto, or one that conflicts, before loading
        opts = SessionOptions(mode=mode, nvml=nvml, out_dir=out_dir, ncu_path=ncu_path,
                              ncu=NcuOptions(launch_skip, launch_count, metric_set=ncu_metrics), top=top,
                              ncu_given=tuple(passed(ctx, *NCU_OPTIONS)), overwrite=overwrite)
        result = run(spec, opts)
    if json_out:
        output.print_json(result)
        return
    render(result)


# refused unless the profile that runs is an Nsight Compute one (--ncu, or auto mode finding ncu on a GPU)
NCU_OPTIONS = ("ncu_path", "launch_skip", "launch_count", "ncu_metrics")


# what still applies when --import re-renders a saved profile
IMPORT_OPTIONS = ("import_dir", "top", "json_out", "ncu_path")


def _check_import_dir(import_dir: Path) -> None:
    from salactl.runtime.json_file import lookup

    fix = "give a directory written by salactl profile --ncu"
    st = lookup(import_dir, UsageError, "--import")      # a path that cannot be looked up: its own line
    if st is None:
        raise UsageError(f"--import {import_dir} does not exist; {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"--import {import_dir} is a file, not a directory; {fix}")


def _ms(v):
    return None if v is None else v * 1e3


def _gap(v):
    return None if v is None else f"{(v - 1) * 100:+.0f}%"


def render(r: dict) -> None:
    from salactl.reports.profile_table import UNATTRIBUTED

    m, p = r["manifest"], r["peaks"]
    # torch.profiler on CPU times aten ops (views and other wrappers among them), not kernels
    unit = "kernels" if r["mode"] == "ncu" or m["device"].startswith("cuda") else "aten ops"
    output.stdout.print(
        f"{r['mode']} profile of {m['source']} ({m.get('backend', 'reference')} backend) on {m['device_name']} "
        f"({m['dtype']}, KV {m['kv_dtype']}, weights {m.get('weights') or m.get('spec', {}).get('weights', '?')}); "
        f"ceilings {output.ceilings(p)}; "
        f"{r['kernel_count']} {unit}{_outside_note(r)}")
    measured = r["mode"] == "ncu"
    bytes_note = ("bytes = DRAM" if measured
                  else "no measured bytes: GB/s and % peak come from the analytic bytes")
    for phase, step in m["steps"].items():
        rows = [x for x in r["ops"] if x["phase"] == phase]
        wall = ("; total = the step's wall time" if any(x["op"] == UNATTRIBUTED for x in rows) else "")
        _table(
            f"{phase}: batch {step['batch']} × {step['new_tokens']} new tokens after "
            f"{step['cached_tokens']} cached — per op (top offenders first: time ms − floor ms, largest "
            f"first; {bytes_note}; % peak = bandwidth or compute, the higher{wall})",
            ["op", unit, "time ms", "bytes", "GB/s", "TFLOP/s", "% peak BW", "% peak", "analytic bytes",
             "floor ms", "bytes gap", "time/floor"],
            [[x["op"], x["kernels"], _ms(x["time_s"]),
              None if x["dram_bytes"] is None else human_bytes(x["dram_bytes"]),
              x["achieved_gbps"], x.get("achieved_tflops"), x["pct_of_peak_bw"], x.get("pct_of_peak"),
              human_bytes(x["analytic_bytes"]), _ms(x["floor_s"]), _gap(x["bytes_ratio"]), x["time_over_floor"]]
             for x in rows], () if measured else TORCH_UNFILLED_OP_COLUMNS)
        _render_layers(phase, [x for x in r.get("layers", []) if x["phase"] == phase], unit, measured)
    names = _short_names([x["name"] for x in r["kernels"]])
    order = ("time beyond the bytes' bandwidth floor" if measured
             else "most time first; torch.profiler measures no bytes")
    _table(
        f"{unit} (top offenders: {order})",
        ["kernel" if unit == "kernels" else "aten op", "phase", "op", "n", "time ms", "DRAM", "GB/s",
         "% peak BW", "SM %", "mem/DRAM %", "floor ms"],
        [[names[x["name"]], x["phase"], x["op"], x["count"], _ms(x["time_s"]),
          None if x["dram_bytes"] is None else human_bytes(x["dram_bytes"]),
          x["achieved_gbps"], x["pct_of_peak_bw"], x["sm_pct"], x["mem_pct"], _ms(x["floor_s"])]
         for x in r["kernels"]], () if measured else TORCH_UNFILLED_KERNEL_COLUMNS)
    for note in r.get("notes", []):
        output.stdout.print(f"note: {note}")
    if r.get("nvml"):
        n = r["nvml"]
        parts = [f"{k} {v['min']:.0f}..{v['max']:.0f}" for k, v in n.items() if isinstance(v, dict)]
        output.stdout.print("nvml: " + "; ".join(parts) +
                            f"; throttle reasons: {', '.join(n['throttle_reasons']) or 'none'}")
    if "elapsed_s" in r:
        output.stdout.print(f"finished in {r['elapsed_s']:.1f} s; files in {r['out_dir']}")


def _outside_note(r: dict) -> str:
    """What the header's count holds beyond the phases' total rows: kernels outside the profiled
    phases (an imported capture's kernels outside salactl's NVTX ranges, or of a phase left out),
    which only the kernel table lists."""
    outside = r["kernel_count"] - sum(x["kernels"] for x in r["ops"] if x["op"] == "total")
    return f", {outside} outside the profiled phases" if outside > 0 else ""


NAME_WIDTH = 60


def _short_names(names: list[str]) -> dict[str, str]:
    """The kernel table's name per full name: cut to NAME_WIDTH, ending in "…"; distinct names whose
    cuts are the same (C++ template instances differ late) end in a short hash of the full name
    instead, so they do not read as duplicate rows."""
    import hashlib
    from collections import Counter

    cut = {n: n if len(n) <= NAME_WIDTH else n[:NAME_WIDTH - 1] + "…" for n in dict.fromkeys(names)}
    shared = {c for c, k in Counter(cut.values()).items() if k > 1}
    return {n: (n[:NAME_WIDTH - 8] + "…#" + hashlib.blake2b(n.encode(), digest_size=3).hexdigest()
                if c in shared else c) for n, c in cut.items()}


# what a torch.profiler profile never fills (no DRAM bytes or counters): left out of its text tables,
# kept (null) in --json
TORCH_UNFILLED_OP_COLUMNS = ("bytes", "bytes gap")
TORCH_UNFILLED_KERNEL_COLUMNS = ("DRAM", "GB/s", "% peak BW", "SM %", "mem/DRAM %", "floor ms")


def _table(title: str, columns: list[str], rows: list[list], unfilled: tuple[str, ...]) -> None:
    keep = [i for i, c in enumerate(columns) if c not in unfilled]
    output.table(title, [columns[i] for i in keep], [[row[i] for i in keep] for row in rows])


def _render_layers(phase: str, rows: list[dict], unit: str, measured_bytes: bool) -> None:
    if not rows:
        return
    output.table(
        f"{phase}: per layer (model order; floor = the analytic bytes at peak bandwidth or FLOPs at peak "
        "matmul rate, the longer)",
        ["layer", "kind", unit, "time ms", *(["DRAM"] if measured_bytes else []), "analytic bytes",
         "floor ms", "% peak", "time/floor"],
        [[x["scope"] if x["layer"] is None else x["layer"], x["kind"], x["kernels"], _ms(x["time_s"]),
          *([None if x["dram_bytes"] is None else human_bytes(x["dram_bytes"])] if measured_bytes else []),
          human_bytes(x["analytic_bytes"]), _ms(x["floor_s"]), x["pct_of_peak"], x["time_over_floor"]]
         for x in rows])


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
