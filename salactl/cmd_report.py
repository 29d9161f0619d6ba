"""`salactl report`: render saved records (latency: Markdown/CSV/HTML with plots, side by side per
label) and the analytic memory report (`salactl report memory`). `salactl report FILE.jsonl` is
short for `salactl report latency FILE.jsonl`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from salactl import input_files, output
from salactl.units import human_bytes
from salactl.errors import CheckpointError, UsageError
from salactl.lists import parse_list
from salactl.options import JsonOpt, ModelOpt, non_empty_path, passed, refuse_unused

FORMATS = ("md", "csv", "html")
DEFAULT_CONTEXTS = "4096,32768,131072,524288"
DEFAULT_GPUS = "H200,H100,A100-SXM4-80GB,RTX PRO 6000,L40S,RTX 5090"
DEFAULT_WEIGHTS = ("bf16", "w4a16")
FIXED_PARTS = {"workspace_estimate": "workspace (est.)", "cuda_graphs_estimate": "CUDA graphs (est.)",
               "cuda_context_estimate": "CUDA context (est.)"}


class _DefaultToLatency(TyperGroup):
    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] != "--help":
            args = ["latency", *args]
        return super().parse_args(ctx, args)


report_app = typer.Typer(cls=_DefaultToLatency, no_args_is_help=True,
                         help="Render records (latency) or the analytic memory report. `salactl report "
                              "FILE.jsonl ...` is short for `salactl report latency FILE.jsonl ...`.")


def _items(text: str, flag: str) -> list[str]:
    """The comma-separated names of `text`, stripped, each once; an empty one among others (a trailing
    comma) is a UsageError, as lists.parse_list's; [""] for a text of no names."""
    items = [x.strip() for x in text.split(",")]
    if any(items) and "" in items:
        raise UsageError(f"{flag} takes comma-separated names, got {text!r}; drop the empty name")
    return list(dict.fromkeys(items))


def _formats(text: str) -> list[str]:
    fmts = _items(text, "--format")
    bad = [f for f in fmts if f not in FORMATS]
    if bad:
        raise UsageError(f"unknown --format {bad[0] if any(fmts) else text!r}; valid: {', '.join(FORMATS)}")
    return fmts


@report_app.command("latency")
def latency(
    ctx: typer.Context,
    records: Annotated[list[Path], typer.Argument(metavar="<records.jsonl>", parser=non_empty_path("a records path", "a JSON lines file from bench, sweep or run"), help="Records files (JSON lines).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="<path>", parser=non_empty_path("--out", "a directory"), help="Write report.<fmt> files here.")] = None,
    formats: Annotated[str, typer.Option("--format", help="Comma list of md, csv, html written to --out; "
                                         "without --out, one of md or csv goes to stdout (default md).")]
    = "md,csv,html",
    title: Annotated[str, typer.Option("--title", help="Heading of the Markdown and HTML reports.")] = "Latency report",
    no_plots: Annotated[bool, typer.Option("--no-plots", help="HTML (with --out) without plots.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace report files already in --out.")]
    = False,
    json_out: JsonOpt = False,
) -> None:
    """Render bench/sweep/run records to Markdown, CSV and HTML, runs side by side by label."""
    from salactl.reports import latency as model
    from salactl.reports.atomic import check_out_dir, write_all
    from salactl.reports.records import load_records
    from salactl.reports.render_html import render as html
    from salactl.reports.render_text import csv_text, markdown

    fmts = _formats(formats)
    if out is None and not {"md", "csv"} & set(fmts):
        raise UsageError("--format html needs --out DIR (only md or csv can go to stdout)")
    _check_latency_options(ctx, out, fmts, json_out)
    if out is not None:
        check_out_dir(out, tuple(f"report.{f}" for f in fmts), overwrite)
    report = model.build(load_records(list(records)))
    written: list[Path] = []
    if out is not None:
        renderers = {"md": lambda: markdown(report, title), "csv": lambda: csv_text(report),
                     "html": lambda: html(report, title, not no_plots)}
        files = {out / f"report.{f}": renderers[f]() for f in fmts}
        written = write_all(files, overwrite)
        _stale_reports(out, fmts, overwrite)
    if json_out:
        output.print_json({**report.to_dict(), "files": written})
    elif out is None:
        text = markdown(report, title) + "\n" if "md" in fmts else csv_text(report)
        print(text, end="")
    else:
        output.stdout.print("wrote " + ", ".join(map(str, written)))


def _stale_reports(out: Path, fmts: list[str], overwrite: bool) -> None:
    """The report.<fmt> files of an earlier report that this one did not write (it had more --format
    values): removed with --overwrite, so that --out holds one report; else kept, which stderr says."""
    stale = [out / f"report.{f}" for f in FORMATS if f not in fmts and (out / f"report.{f}").is_file()]
    if not stale:
        return
    if overwrite:
        for path in stale:
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                output.stderr.print(f"note: cannot remove {path} of an earlier report: {e.strerror or e}")
    else:
        output.stderr.print(f"note: kept {', '.join(p.name for p in stale)} of an earlier report in {out}; "
                            "--overwrite removes the report files this one does not write")


def _check_latency_options(ctx: typer.Context, out: Path | None, fmts: list[str], json_out: bool) -> None:
    """--overwrite, --no-plots, --format and --title only where a file or output they change is written."""
    # stdout gets one, or only the JSON
    written = fmts if out is not None else [] if json_out else ["md" if "md" in fmts else "csv"]
    if out is None:
        refuse_unused(passed(ctx, "overwrite"), "files written to --out", "add --out DIR, or drop {it}")
        if json_out:
            refuse_unused(passed(ctx, "formats", "title"), "the report files written to --out (--json alone "
                          "prints only the JSON)", "add --out DIR, or drop {it}")
        if passed(ctx, "formats") and len(fmts) > 1:
            raise UsageError(f"--format {','.join(fmts)} names {len(fmts)} formats but only one goes to "
                             f"stdout without --out; give --format {written[0]}, or add --out DIR")
    if "html" not in written:
        refuse_unused(passed(ctx, "no_plots"), "the HTML report (--out DIR with html in --format)", "drop {it}")
    if not {"md", "html"} & set(written):
        refuse_unused(passed(ctx, "title"), "the Markdown and HTML reports", "add md or html to --format, "
                      "or drop {it}")


def _names(text: str, name: str) -> tuple[str, ...]:
    vals = tuple(_items(text, name))
    if not any(vals):
        raise UsageError(f"{name} needs at least one comma-separated value, got {text!r}")
    return vals


def _checkpoint_quantization(model: str) -> dict:
    """The GPTQ settings of the checkpoint --model names, checked as `run` checks them (exit 4 for a
    config loading refuses); {} for a float checkpoint or a preset (a preset name is the preset, as
    planning_config reads it, never a directory of that name here)."""
    from salactl.runtime.json_file import is_dir
    from salactl.runtime.presets import PRESETS

    if model in PRESETS or not is_dir(Path(model), CheckpointError, "model (--model)"):
        return {}
    from salactl.reports.memory_report import checkpoint_quantization

    return checkpoint_quantization(Path(model)) or {}


def _group_size(given: int | None, quant: dict) -> int:
    """--group-size, else the checkpoint's quantization_config group, else GPTQ's usual 128."""
    from salactl.quant.quantizer import SUPPORTED_GROUP_SIZES as GROUP_SIZES

    if given is not None:
        if given not in GROUP_SIZES:
            raise UsageError(f"--group-size must be one of {', '.join(map(str, GROUP_SIZES))}, got {given}")
        return given
    return quant.get("group_size", 128)     # loading checked it (any group dividing the in_features)


def _default_weights(quant: dict) -> tuple[str, ...]:
    """DEFAULT_WEIGHTS, plus the checkpoint's own format where it is another (w8a16 for 8-bit)."""
    from salactl.quant.in_memory import QUANTIZED_BITS

    own = f"w{quant.get('bits')}a16"
    return DEFAULT_WEIGHTS + ((own,) if own in QUANTIZED_BITS and own not in DEFAULT_WEIGHTS else ())


@report_app.command("memory")
def memory(
    ctx: typer.Context,
    model: ModelOpt = "sala-nano",
    context: Annotated[str, typer.Option("--context", help="Context lengths, e.g. 4096,32768,131072.")]
    = DEFAULT_CONTEXTS,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="Comma list: auto, bf16, "
                                                "fp8_e4m3, fp8_e5m2 (as run takes them); planning only: "
                                                "bfloat16, fp16, float16, fp32, float32, fp8.")]
    = "bf16,fp8_e4m3",
    weights: Annotated[Optional[str], typer.Option("--weights", show_default=",".join(DEFAULT_WEIGHTS) + ", plus w8a16 "
                                                   "for an 8-bit checkpoint", help="Comma list: bf16, w4a16, w8a16.")]
    = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", show_default=DEFAULT_GPUS, help="GPU names, comma "
                                               "list; each is matched by the known name it contains "
                                               "(case-insensitive), e.g. 'NVIDIA H100 80GB HBM3'.")] = None,
    gpu_mem: Annotated[Optional[float], typer.Option("--gpu-mem", help="GPU memory in GB (10^9 bytes) instead of a --gpu name's (nvidia-smi's total).")] = None,
    mem_fraction: Annotated[float, typer.Option("--mem-fraction", help="Share of each GPU's total memory "
                                                "usable, in (0, 1]; the weights and fixed parts come out of "
                                                "it (bench/sweep --mem-fraction is a share of the memory "
                                                "free after the weights).")] = 0.9,
    chunk_size: Annotated[int, typer.Option("--chunk-size", help="Prefill chunk in tokens, for the "
                                            "workspace estimate.")] = 8192,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Largest CUDA-graph batch.")] = 32,
    no_cuda_graphs: Annotated[bool, typer.Option("--no-cuda-graphs", help="Leave out the CUDA-graph memory pool estimate.")] = False,
    compressed_keys: Annotated[str, typer.Option("--compressed-keys", help="k1 (our runtime) or k1k2 "
                                                 "(SGLang).")] = "k1",
    records: Annotated[Optional[list[Path]], typer.Option(
        "--records", metavar="<path>", parser=non_empty_path("--records", "a JSON lines file from bench, sweep or run"),
        help="Run/bench/sweep records: those with a measured peak (GPU runs) are compared with the "
             "prediction for their own model and settings (none where one is unknown), the others "
             "skipped.")] = None,
    group_size: Annotated[Optional[int], typer.Option("--group-size", help="GPTQ group of the w4a16/w8a16 rows: "
                                                      "-1, 32, 64 or 128 (default: the checkpoint's, else 128).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Per-request and per-server memory by component, max concurrent requests per GPU, vs. a
    full-attention model of the same size (e.g. --model sala-9b)."""
    from salactl.reports import memory_report as mr
    from salactl.reports.records import load_records

    if not 0 < mem_fraction <= 1:
        raise UsageError(f"--mem-fraction must be in (0, 1], got {mem_fraction}")
    if gpu_mem is not None and not (gpu_mem > 0 and math.isfinite(gpu_mem * 1e9)):
        raise UsageError(f"--gpu-mem must be a positive finite number of GB, got {gpu_mem:g}")
    if gpu is not None and gpu_mem is not None:
        raise UsageError("give --gpu (memory from the GPU table) or --gpu-mem (GB), not both")
    if chunk_size <= 0 or max_batch <= 0:
        raise UsageError("--chunk-size and --max-batch must be positive")
    contexts = tuple(parse_list(context, "--context", minimum=1, dedupe=True))
    kv_dtypes = _names(kv_cache_dtype, "--kv-cache-dtype")
    weight_names = None if weights is None else _names(weights, "--weights")
    gpus = list(_names(DEFAULT_GPUS if gpu is None else gpu, "--gpu"))
    _check_memory_options(ctx, weight_names or DEFAULT_WEIGHTS, records, no_cuda_graphs)
    from salactl.runtime.loader import planning_config

    config = planning_config(model)
    quant = _checkpoint_quantization(model) if group_size is None or weight_names is None else {}
    group_size = _group_size(group_size, quant)
    weight_names = weight_names or _default_weights(quant)
    q = mr.MemoryQuery(
        contexts=contexts, kv_dtypes=kv_dtypes, weights=weight_names, gpus=mr.gpu_list(gpus, gpu_mem),
        mem_fraction=mem_fraction, prefill_chunk=chunk_size, max_batch=max_batch,
        cuda_graphs=not no_cuda_graphs, compressed_keys=compressed_keys, group_size=group_size)
    if context != DEFAULT_CONTEXTS:     # the default table spans the 9B's range for any model
        output.warn_past_trained_length(max(q.contexts), config.max_position_embeddings, "--context")
    recs = load_records(list(records)) if records else None
    result = {"model": input_files.utf8_text(model), **mr.build(config, q, recs, model)}
    if recs and not result["measured"]:
        output.stderr.print(f"note: none of the {len(recs)} records has a measured peak (CPU runs have "
                            "none); no measured rows")
    for x in result["measured_models_unreadable"]:
        whose = (f"are from model {x['model']!r}, which is neither a preset nor a checkpoint directory here"
                 if x["model"] is not None else "name no model")
        output.stderr.print(f"note: {x['records']} measured record(s) {whose}: no prediction for them (not "
                            f"with --model {model}'s shapes)")
    hb = human_bytes
    for x in result["fixed_exceeds_memory"]:
        srv = result["server"][x["weights"]]
        usable = (f"the usable memory of {x['gpu']} ({hb(x['usable_bytes'])} at mem fraction "
                  f"{q.mem_fraction:g})")
        if x["exceeded_by"] == "weights":
            what = f"{x['weights']} weights ({hb(srv['weights']['total'])}) exceed {usable}"
        else:
            what = (f"the {x['weights']} server's fixed total ({hb(x['fixed_bytes'])} = weights "
                    f"{hb(srv['weights']['total'])} + workspace (est.) {hb(srv['workspace_estimate'])} + "
                    f"CUDA graphs (est.) {hb(srv['cuda_graphs_estimate'])} + CUDA context (est.) "
                    f"{hb(srv['cuda_context_estimate'])}) exceeds {usable} once the "
                    f"{FIXED_PARTS[x['exceeded_by']]} is added")
        output.stderr.print(f"note: {what}: 0 requests fit at any context")
    if json_out:
        output.print_json(result)
        return
    render_memory(result)


def _check_memory_options(ctx: typer.Context, weights: tuple[str, ...], records: list[Path] | None,
                          no_cuda_graphs: bool) -> None:
    from salactl.quant.in_memory import QUANTIZED_BITS

    if not records and not QUANTIZED_BITS.keys() & set(weights):
        refuse_unused(passed(ctx, "group_size"), "w4a16/w8a16 weights", "add one to --weights, or drop {it}")
    if no_cuda_graphs:
        refuse_unused(passed(ctx, "max_batch"), "the CUDA-graph pool estimate", "drop {it} or --no-cuda-graphs")


def render_memory(r: dict) -> None:
    hb = human_bytes
    s = r["shape"]
    output.stdout.print(f"{r['model']}: {s['params']:,} parameters, {s['layers']} layers "
                        f"({s['sparse_layers']} sparse, {s['lightning_layers']} lightning); "
                        "(est.) = estimate")
    srv = r["server"]
    output.table("per server (fixed)", ["weights", "weights bytes", "workspace (est.)",
                                        "CUDA graphs (est.)", "CUDA context (est.)", "fixed total"],
                 [[w, hb(s["weights"]["total"]), hb(s["workspace_estimate"]),
                   hb(s["cuda_graphs_estimate"]), hb(s["cuda_context_estimate"]), hb(s["fixed"])]
                  for w, s in srv.items()])
    kept = r["assumptions"]["compressed_keys_kept"]
    parts = [("KV cache", "kv_cache"), ("K1", "compressed_k1"),
             *([("K2", "compressed_k2")] if kept == "k1k2" else []),  # K2 not counted in k1
             ("GLA state", "gla_state"), ("total", "total"),
             ("full attention KV", "full_attention")]
    output.table(f"per request (compressed keys kept: {kept}; {r['assumptions']['compressed_keys_note']})",
                 ["KV dtype", "context", *(column for column, _ in parts)],
                 [[x["kv_dtype"], x["context"], *(hb(x[key]) for _, key in parts)]
                  for x in r["per_request"]])
    if r["concurrency"]:
        output.table(f"max concurrent requests (mem fraction {r['assumptions']['mem_fraction']})",
                     ["GPU", "memory", "weights", "KV dtype", "context", "SALA", "full attention", "ratio"],
                     [[x["gpu"], f"{hb(x['gpu_bytes'])} ({x['gpu_bytes_source']})", x["weights"], x["kv_dtype"],
                       x["context"], x["max_requests"], x["max_requests_full_attention"], x["ratio"]]
                      for x in r["concurrency"]])
    if r["measured"]:
        output.table("measured peaks vs analytic", ["label", "phase", "model", "context", "batch",
                                                    "weights", "KV dtype", "measured", "predicted", "from",
                                                    "ratio"],
                     [[x["label"], x["phase"], x["model"], x["context"], x["batch"], x["weights"],
                       x["kv_dtype"], hb(x["measured_peak"]),
                       None if x["predicted"] is None else hb(x["predicted"]), x["predicted_with"], x["ratio"]]
                      for x in r["measured"]])


def register(app: typer.Typer) -> None:
    app.add_typer(report_app, name="report")
