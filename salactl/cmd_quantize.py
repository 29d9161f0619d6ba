"""`salactl quantize`: GPTQ (or RTN) W4A16/W8A16 checkpoints that vLLM/SGLang load as gptq_marlin,
plus calibrated FP8 KV-cache scales. Summary table per linear (RTN vs chosen-method output error,
solve time) on stdout or `--json`; progress on stderr; nothing is written unless all of it is."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from salactl import output
from salactl.options import (DTYPE_HELP, DeviceOpt, JsonOpt, ModelOpt, RandomWeightsOpt, TokenizerOpt, non_empty, non_empty_path,
                             passed, refuse_unused, seed_option)
from salactl.quant.defaults import DEFAULT_DAMP


def quantize(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", metavar="<path>", parser=non_empty_path("--out", "a directory"), help="Output checkpoint directory.")],
    model: ModelOpt = "sala-nano",
    random_weights: RandomWeightsOpt = False,
    seed: seed_option("--random-weights, which calibration windows are taken and --calib random's ids") = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --out if it exists.")] = False,
    bits: Annotated[int, typer.Option("--bits", help="4 or 8 (symmetric).")] = 4,
    group_size: Annotated[int, typer.Option("--group-size", help="-1 (per channel), 32, 64 or 128.")] = 128,
    method: Annotated[str, typer.Option("--method", help="gptq or rtn (round to nearest).")] = "gptq",
    desc_act: Annotated[bool, typer.Option("--desc-act/--no-desc-act", help="GPTQ only: act-order with static "
                                           "groups (the checkpoint stays desc_act=false; on by default: lower "
                                           "perplexity on sala-nano, BENCHMARKS.md).")] = True,
    clip_search: Annotated[bool, typer.Option("--clip-search/--no-clip-search", help="GPTQ only: each group's "
                                              "scale from the max-abs shrunk by 0-20%, whichever gives the least "
                                              "Hessian-diagonal-weighted error (on by default: lower perplexity on "
                                              "sala-nano, BENCHMARKS.md).")] = True,
    damp: Annotated[float, typer.Option("--damp", help="GPTQ only: Hessian damping fraction, in (0, 1) "
                                        "(raised by 0.01 when Cholesky fails).")] = DEFAULT_DAMP,
    calib: Annotated[Optional[str], typer.Option("--calib", parser=non_empty("--calib", "a text or JSONL file, or random"), help="Text or JSONL (\"text\" field) file; "
                                                 "'random' for random ids; default: the built-in corpus.")] = None,
    nsamples: Annotated[int, typer.Option("--nsamples", help="Calibration sequences.")] = 128,
    seqlen: Annotated[int, typer.Option("--seqlen", help="Tokens per calibration sequence.")] = 2048,
    device: DeviceOpt = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help=f"Dtype the model loads and the calibration forwards "
                                       f"run in: {DTYPE_HELP} A checkpoint's linears are quantized from their "
                                       "stored weights and its other tensors copied as stored (its torch_dtype): "
                                       "without calibration it sets only the memory the load takes; random "
                                       "weights are drawn in this dtype.")] = "auto",
    tokenizer: TokenizerOpt = None,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="bf16 or auto (no KV scales), "
                                                "fp8_e4m3 or fp8_e5m2: calibrate and store FP8 KV "
                                                "scales.")] = "bf16",
    kv_scales_per_head: Annotated[bool, typer.Option("--kv-scales-per-head", help="One FP8 KV scale per KV "
                                                     "head (with an fp8 --kv-cache-dtype).")] = False,
    batch_tokens: Annotated[int, typer.Option("--batch-tokens", help="Calibration tokens per forward call.")] = 16384,
    json_out: JsonOpt = False,
) -> None:
    """Quantize a checkpoint to GPTQ (Marlin-compatible) and calibrate FP8 KV scales."""
    from salactl.quant.api import needs_calibration, quantize_checkpoint
    from salactl.quant.sequential import QuantOptions

    if method == "rtn":
        refuse_unused(passed(ctx, "desc_act", "damp", "clip_search"), "--method gptq only (RTN rounds each weight on its own)",
                      "drop {it} with --method rtn")
    opts = QuantOptions(bits, group_size, method, desc_act, damp, kv_cache_dtype, kv_scales_per_head, batch_tokens,
                        clip_search)
    if not needs_calibration(opts, calib):
        refuse_unused(passed(ctx, *CALIBRATION_OPTIONS), "calibration data, which --method rtn reads only with "
                      "--calib or an fp8 --kv-cache-dtype", "drop {it}, or add --calib FILE (or random)")
        if not random_weights:
            # --dtype stays: it sets the memory the weights load into (the exit-11 advice names it)
            refuse_unused(passed(ctx, "seed"), "--random-weights and the calibration windows, neither of which "
                          "this quantize has (--method rtn without --calib or an fp8 --kv-cache-dtype)",
                          "drop {it}")
    with _ProgressBar() as bar:
        record = quantize_checkpoint(model, out, opts, calib=calib, nsamples=nsamples, seqlen=seqlen,
                                     tokenizer=tokenizer, seed=seed, device=device, dtype=dtype,
                                     random_weights=random_weights, overwrite=overwrite, progress=bar)
    if json_out:
        output.print_json(record)
    else:
        render(record)


# used only to build and feed calibration windows
CALIBRATION_OPTIONS = ("tokenizer", "nsamples", "seqlen", "batch_tokens")


class _ProgressBar:
    """quantize_checkpoint's progress on stderr: a transient bar on a terminal; off one (CI logs,
    nohup) a plain line at every tenth instead."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=output.stderr, transient=True, disable=not output.stderr.is_terminal)
        self.task = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task(label, total=total)
            return
        self.bar.update(self.task, completed=done, description=label)
        if not output.stderr.is_terminal and done * 10 // total > (done - 1) * 10 // total:
            output.stderr.print(f"quantizing: {done}/{total} module groups ({label})")

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        if self.task is not None:
            self.bar.stop()


def render(r: dict) -> None:
    from salactl.units import human_bytes

    output.table(
        f"{r['method'].upper()} {r['bits']}-bit g{r['group_size']}"
        + (" act-order (static groups)" if r["desc_act"] else "") + (", clip search" if r["clip_search"] else ""),
        ["module", "out x in", "damp", "RTN err", "err", "time s"],
        [[m["name"], f"{m['out_features']}x{m['in_features']}", m["damp"], m["rtn_error"], m["error"],
          m["seconds"]] for m in r["modules"]])
    if any(m["error"] is not None or m["rtn_error"] is not None for m in r["modules"]):
        output.stdout.print("err, RTN err: relative layer-output error ‖WX − QX‖ / ‖WX‖ on the calibration "
                            "activations (the method's, round-to-nearest's)")
    if r["modules"]:
        output.stdout.print("time s: the module's share, by output rows, of its group's weight load and solve, "
                            "plus its own error metrics and packing (the module times add up to solve)")
    for name, why in r["skipped"].items():
        output.stdout.print(f"unquantized: {name} ({why})")
    c, s = r["calibration"], r["seconds"]
    frac = r["fraction_better_than_rtn"]
    output.stdout.print(
        (f"calibration: {c['samples']} x {c['seqlen']} tokens ({c['source']}); " if c else "calibration: none; ")
        + (f"error below RTN on {frac * 100:.1f}% of modules{_in_sample(r)}; " if frac is not None else "")
        + f"time {s['total']:.1f} s (forward {s['forward']:.1f}, solve {s['solve']:.1f}, write {s['write']:.1f})"
        + (f"; peak GPU memory {r['peak_gpu_gib']:.1f} GiB" if r.get("peak_gpu_gib") is not None else ""))
    if r["kv_scales"]:
        output.stdout.print(f"FP8 KV scales ({r['kv_cache_dtype']}) for layers {', '.join(r['kv_scales'])}")
    size = r.get("checkpoint_bytes") or {}
    output.stdout.print(f"wrote {r['out']}" + (f" ({human_bytes(size['written'])} of safetensors" + (
        f", from {human_bytes(size['source'])})" if size.get("source") else ")") if size.get("written") else ""))


def _in_sample(r: dict) -> str:
    """Where the calibration tokens cannot determine the widest linear's Hessian, GPTQ's errors were
    fitted, not measured."""
    if not r.get("calibration_underdetermined"):
        return ""
    return f" (in-sample: {r['calibration']['tokens']:,} calibration tokens < {r['widest_in_features']:,} inputs)"


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize)
