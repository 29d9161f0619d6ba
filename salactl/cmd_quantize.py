"""`salactl quantize`: GPTQ (or RTN) W4A16/W8A16 checkpoints that vLLM/SGLang load as gptq_marlin,
plus calibrated FP8 KV-cache scales. Summary table per linear (RTN vs chosen-method output error,
solve time) on stdout or `--json`; progress on stderr; nothing is written unless all of it is."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from salactl import output
from salactl.errors import QuantizationError, UsageError
from salactl.options import DeviceOpt, DtypeOpt, JsonOpt, ModelOpt, RandomWeightsOpt, SeedOpt, TokenizerOpt


def quantize(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output checkpoint directory.")],
    model: ModelOpt = "sala-nano",
    random_weights: RandomWeightsOpt = False,
    seed: SeedOpt = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --out if it exists.")] = False,
    bits: Annotated[int, typer.Option("--bits", help="4 or 8 (symmetric).")] = 4,
    group_size: Annotated[int, typer.Option("--group-size", help="-1 (per channel), 32, 64 or 128.")] = 128,
    method: Annotated[str, typer.Option("--method", help="gptq or rtn.")] = "gptq",
    desc_act: Annotated[bool, typer.Option("--desc-act/--no-desc-act", help="Act-order with static groups "
                                           "(the checkpoint stays desc_act=false; on by default: lower "
                                           "perplexity on sala-nano, BENCHMARKS.md).")] = True,
    damp: Annotated[float, typer.Option("--damp", help="Hessian damping fraction (raised by 0.01 "
                                        "when Cholesky fails).")] = 0.01,
    calib: Annotated[Optional[str], typer.Option("--calib", help="Text or JSONL (\"text\" field) file; "
                                                 "'random' for random ids; default: the built-in corpus.")] = None,
    nsamples: Annotated[int, typer.Option("--nsamples", help="Calibration sequences.")] = 128,
    seqlen: Annotated[int, typer.Option("--seqlen", help="Tokens per calibration sequence.")] = 2048,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    tokenizer: TokenizerOpt = None,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="bf16, fp8_e4m3 or fp8_e5m2: "
                                                "calibrate and store FP8 KV scales.")] = "bf16",
    kv_scales_per_head: Annotated[bool, typer.Option("--kv-scales-per-head",
                                                     help="One FP8 KV scale per KV head.")] = False,
    batch_tokens: Annotated[int, typer.Option("--batch-tokens", help="Calibration tokens per forward call.")] = 16384,
    json_out: JsonOpt = False,
) -> None:
    """Quantize a checkpoint to GPTQ (Marlin-compatible) and calibrate FP8 KV scales."""
    from salactl.quant.sequential import QuantOptions

    desc_act = desc_act and method == "gptq"          # act-order only changes GPTQ's column order
    opts = QuantOptions(bits, group_size, method, desc_act, damp, kv_cache_dtype, kv_scales_per_head, batch_tokens)
    if batch_tokens < 1:
        raise UsageError(f"--batch-tokens must be positive, got {batch_tokens}")
    from salactl.runtime.checkpoint import check_output_dir

    check_output_dir(out, overwrite)
    record = run_quantize(opts, model, random_weights, seed, out, overwrite, calib, nsamples, seqlen,
                          device, dtype, tokenizer)
    if json_out:
        output.print_json(record)
    else:
        render(record)


def run_quantize(opts, model: str, random_weights: bool, seed: int, out: Path, overwrite: bool,
                 calib: str | None, nsamples: int, seqlen: int, device: str, dtype: str,
                 tokenizer: str | None) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from salactl.env import environment
    from salactl.quant.calibration import RANDOM, calibration_windows
    from salactl.quant.linear import W4A16Linear
    from salactl.quant.sequential import layer_groups, quantize_model
    from salactl.quant.writer import quantization_config, write_quantized_checkpoint
    from salactl.runtime.kv_fp8 import fp8_dtype, sglang_scales_json
    from salactl.runtime.loader import load_model
    from salactl.runtime.tokenizer import find_tokenizer

    t_start = time.perf_counter()
    lm = load_model(model, device, dtype, random_weights, seed)
    if any(isinstance(m, W4A16Linear) for m in lm.model.modules()):
        raise QuantizationError(f"{model} is already quantized; quantize the original checkpoint")
    cfg = lm.config
    calib_src = calib
    tok = None
    windows = None
    # RTN reads no activations: calibrate only for FP8 KV scales or when --calib asks for the errors
    needs_calib = opts.method != "rtn" or calib is not None or fp8_dtype(opts.kv_cache_dtype) is not None
    if not needs_calib:
        output.stderr.print("note: RTN needs no calibration data; pass --calib FILE (or 'random') to also "
                            "report each module's output error")
    elif calib != RANDOM:
        try:
            tok = find_tokenizer(tokenizer, lm.model_dir)
        except Exception:
            if calib is not None or not random_weights:
                raise
            calib_src = RANDOM          # random weights without any tokenizer: random ids
            output.stderr.print("note: no tokenizer for random weights; calibrating on random token ids")
    if needs_calib:
        output.warn_past_trained_length(seqlen, cfg.max_position_embeddings, "--seqlen")
        windows = calibration_windows(calib_src, tok, nsamples, seqlen, cfg.vocab_size, seed,
                                      eos_id=cfg.eos_token_id[0])
    if windows is not None and windows.shape[0] < nsamples:
        output.stderr.print(f"warning: the calibration text gives {windows.shape[0]} windows of "
                            f"{windows.shape[1]} tokens, fewer than --nsamples {nsamples}")
    total = sum(1 for i in range(cfg.num_hidden_layers) for _ in layer_groups(cfg, i))
    t_loaded = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=output.stderr, transient=True, disable=not output.stderr.is_terminal) as bar:
        task = bar.add_task("quantizing", total=total)
        done = [0]

        def advance(label: str) -> None:
            bar.update(task, advance=1, description=label)
            done[0] += 1
            # no bar off a terminal (CI logs, nohup): a plain line at every tenth instead
            if not output.stderr.is_terminal and done[0] * 10 // total > (done[0] - 1) * 10 // total:
                output.stderr.print(f"quantizing: {done[0]}/{total} module groups ({label})")

        result = quantize_model(lm.model, cfg, windows, opts, progress=advance)
    for line in result.damp_raised:
        output.stderr.print(f"note: Cholesky failed at the requested damping; raised {line}")
    t_solved = time.perf_counter()
    fp8 = fp8_dtype(opts.kv_cache_dtype) is not None
    qc = quantization_config(opts.bits, opts.group_size, opts.desc_act, opts.damp, opts.method, result.skipped,
                             opts.kv_cache_dtype if fp8 else None)
    kv_json = sglang_scales_json(result.kv_scales, opts.kv_cache_dtype, cfg) if fp8 else None
    write_quantized_checkpoint(out, cfg, lm.model, result.quantized, qc, lm.model_dir, result.kv_scales,
                               kv_json, overwrite=overwrite)
    t_done = time.perf_counter()
    reports = [r.__dict__ for r in result.reports]
    # RTN against itself is no comparison
    better = [r for r in result.reports if r.error is not None and r.rtn_error is not None] \
        if opts.method != "rtn" else []
    return {
        "out": str(out),
        "model": lm.source,
        "method": opts.method, "bits": opts.bits, "group_size": opts.group_size, "desc_act": opts.desc_act,
        "damp": opts.damp, "kv_cache_dtype": opts.kv_cache_dtype,
        "calibration": None if windows is None else {
            "source": calib_src or "builtin-corpus", "samples": int(windows.shape[0]),
            "seqlen": int(windows.shape[1]), "tokens": int(windows.numel())},
        "modules": reports,
        "skipped": result.skipped,
        "damp_raised": result.damp_raised,
        "kv_scales": None if not result.kv_scales else {
            str(i): {"k": k.flatten().tolist(), "v": v.flatten().tolist()} for i, (k, v) in result.kv_scales.items()},
        "fraction_better_than_rtn": (sum(r.error < r.rtn_error for r in better) / len(better)) if better else None,
        "seconds": {"load_and_calibration_data": t_loaded - t_start, "forward": result.forward_seconds,
                    "solve": result.solve_seconds, "quantize_total": t_solved - t_loaded,
                    "write": t_done - t_solved, "total": t_done - t_start},
        "peak_gpu_gib": _peak_gpu_gib(device),
        "env": environment(),
    }


def _peak_gpu_gib(device: str) -> float | None:
    """Peak torch-allocated memory on the quantizing GPU (None on CPU)."""
    import torch

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(torch.device(device)) / 2**30


def render(r: dict) -> None:
    output.table(
        f"{r['method'].upper()} {r['bits']}-bit g{r['group_size']}"
        + (" act-order (static groups)" if r["desc_act"] else ""),
        ["module", "out x in", "damp", "RTN err", "err", "time s"],
        [[m["name"], f"{m['out_features']}x{m['in_features']}", m["damp"], m["rtn_error"], m["error"],
          m["seconds"]] for m in r["modules"]])
    for name, why in r["skipped"].items():
        output.stdout.print(f"unquantized: {name} ({why})")
    c, s = r["calibration"], r["seconds"]
    frac = r["fraction_better_than_rtn"]
    output.stdout.print(
        (f"calibration: {c['samples']} x {c['seqlen']} tokens ({c['source']}); " if c else "calibration: none; ")
        + (f"error below RTN on {frac * 100:.1f}% of modules; " if frac is not None else "")
        + f"time {s['total']:.1f} s (forward {s['forward']:.1f}, solve {s['solve']:.1f}, write {s['write']:.1f})"
        + (f"; peak GPU memory {r['peak_gpu_gib']:.1f} GiB" if r.get("peak_gpu_gib") is not None else ""))
    if r["kv_scales"]:
        output.stdout.print(f"FP8 KV scales ({r['kv_cache_dtype']}) for layers {', '.join(r['kv_scales'])}")
    output.stdout.print(f"wrote {r['out']}")


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize)
