"""`salactl bench`: SOAR and serving profiles against the embedded engine or an SGLang / vLLM
server, with SGLang's metric definitions; records in --out, a table or --json on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from salactl import input_files, out_dirs, output
from salactl.errors import UsageError
from salactl.options import (SEED_MAX, DeviceOpt, DtypeOpt, JsonOpt, RandomWeightsOpt, TokenizerOpt, non_empty,
                             non_empty_path, passed_names)


def bench(
    ctx: typer.Context,
    profile: Annotated[str, typer.Option("--profile", parser=non_empty("--profile", "a shipped profile or a .toml file"), help="soar, decode, prefill, long-context, serving, or a .toml PATH.")] = "soar",
    dataset: Annotated[Optional[str], typer.Option("--dataset", parser=non_empty("--dataset", "a SOAR-format JSONL file or S1=a.jsonl,..."), help="SOAR-format JSONL (question, model_response) for every phase, or S1=a.jsonl,S8=b.jsonl,... Every row runs in each phase, as SOAR's script passes --num-prompts = the file's rows (the profile's num_requests sizes only synthetic sets); --num-requests caps it.")] = None,
    skip_bad_rows: Annotated[bool, typer.Option("--skip-bad-rows", help="Drop malformed --dataset rows instead of stopping (needs --dataset).")] = False,
    scale: Annotated[Optional[float], typer.Option("--scale", help="Multiply the synthetic prompts' input and output lengths (e.g. 0.01 for a CPU; default 1); request counts are unchanged. Not with --dataset, whose rows keep their lengths.")] = None,
    num_requests: Annotated[Optional[int], typer.Option("--num-requests", help="At most N requests per phase. Not for the one-batch profiles (decode, prefill, long-context), whose batch size sets each phase's count: pick batch sizes with --phases.")] = None,
    phases: Annotated[Optional[str], typer.Option("--phases", help="Run only these phases, e.g. S1,S8.")] = None,
    endpoint: Annotated[Optional[str], typer.Option("--endpoint", parser=non_empty("--endpoint", "a server URL, or leave it out for the embedded runtime"), help="Server URL, e.g. http://127.0.0.1:30000.")] = None,
    backend: Annotated[Optional[str], typer.Option("--backend", parser=non_empty("--backend", "sglang, openai or vllm, or leave it out for sglang"), help="With --endpoint: sglang (/generate, the default), openai (/v1/completions) or vllm (vLLM's server: the openai protocol).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Embedded: checkpoint dir or preset (default sala-nano). Server: served model name (default: the one it reports); a local directory's config.json, of any model, sizes the random prompt ids.")] = None,
    tokenizer: TokenizerOpt = None,
    random_weights: RandomWeightsOpt = False,
    seed: Annotated[Optional[int], typer.Option("--seed", min=0, max=SEED_MAX, help="Seed for the dataset shuffle, synthetic prompts and arrival times (default: the profile's own, 1 for soar), and for --random-weights (default 0).")] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    chunk_size: Annotated[Optional[int], typer.Option("--chunk-size", help="Prefill chunk in tokens (default 8192 on the GPU engine, 512 on the reference).")] = None,
    engine: Annotated[str, typer.Option("--engine", help="Embedded engine: auto (GPU engine on CUDA), reference (one sequence at a time) or gpu.")] = "auto",
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="Embedded KV cache: bf16 or auto (stores the model's dtype), fp8_e4m3 (calibrated scales) or fp8_e5m2.")] = "bf16",
    max_running_requests: Annotated[Optional[int], typer.Option("--max-running-requests", help="GPU engine: requests batched at once (default 64); refused on the reference engine, which runs one.")] = None,
    mem_fraction: Annotated[Optional[float], typer.Option("--mem-fraction", help="GPU engine: share of the GPU memory still free once the weights are loaded that its KV/state caches and prefill workspace take, in (0, 1] (default 0.9); a request that cannot fit fails with a capacity error. Refused on the reference engine.")] = None,
    reference: Annotated[Optional[str], typer.Option("--reference", parser=non_empty("--reference", "reference durations such as S1=400,S8=600, or leave it out"), help="Reference durations in seconds for the score, e.g. S1=400,S8=600,Smax=1100.")] = None,
    accuracy: Annotated[Optional[float], typer.Option("--accuracy", help="Normalized accuracy in % (SOAR overall_accuracy) for the score coefficient; needs --reference.")] = None,
    slo: Annotated[Optional[str], typer.Option("--slo", parser=non_empty("--slo", "SLOs such as ttft=500,tpot=50, or leave it out"), help="Goodput SLOs in ms, e.g. ttft=500,tpot=50[,e2el=...].")] = None,
    details: Annotated[bool, typer.Option("--details", help="Also write a per-request CSV.")] = False,
    out: Annotated[Path, typer.Option("--out", "-o", metavar="<path>", parser=non_empty_path("--out", "a directory"), help="Directory for records.jsonl and summaries.")] = Path("salactl-results"),
    label: Annotated[Optional[str], typer.Option("--label", help="A name for this run in the records.")] = None,
    flush_sleep: Annotated[float, typer.Option("--flush-sleep", help="Seconds to wait after a server cache flush (SGLang waits 1), at most 3600.")] = 1.0,
    request_timeout: Annotated[float, typer.Option("--request-timeout", help="Total time one server request may take, in seconds, from connecting to its last token (time queued on the server counts): a request still unfinished then fails. Default 6 h, the total limit of SGLang's and vLLM's bench clients; at most 604800 (a week); 0: no limit. The endpoint probe and cache flush wait min(30 s, this).")] = 21600.0,
    json_out: JsonOpt = False,
) -> None:
    """Benchmark a profile (SOAR S1/S8/Smax by default) and record SGLang-style metrics."""
    from salactl.bench.job import BenchSettings, run_bench
    from salactl.bench.live import RichProgress
    from salactl.bench.summary import phase_notes, score_line, table_rows

    out_dirs.directory_option(out, files=("records.jsonl",))
    check_tokenizer_used(tokenizer, endpoint, dataset)
    label = None if label is None else input_files.utf8_text(label)
    settings = BenchSettings(
        profile=profile, dataset=dataset, skip_bad_rows=skip_bad_rows, scale=scale,
        num_requests=num_requests, phases=phase_names(phases),
        endpoint=endpoint, backend=backend, model=model, tokenizer=tokenizer,
        random_weights=random_weights, seed=seed, device=device, dtype=dtype, chunk_size=chunk_size,
        engine=engine, kv_cache_dtype=kv_cache_dtype, max_running_requests=max_running_requests,
        mem_fraction=mem_fraction,
        reference=reference, accuracy=accuracy, slo=slo, details=details, out=out, label=label,
        flush_sleep=flush_sleep, request_timeout=request_timeout, given=passed_names(ctx))
    progress = RichProgress()
    try:
        run = run_bench(settings, progress)
    finally:
        progress.close()
    result = run.to_dict()
    if json_out:
        output.print_json(result)
        return
    cols, rows = table_rows(result)
    output.table(f"bench {result['profile']} on {result['target']} ({result['model']})", cols, rows)
    line = score_line(result)
    if line:
        output.stdout.print(line)
    for note in phase_notes(result):
        output.stdout.print(note.replace("**", ""))
    files = result["files"]
    if "summary_md" in files:
        output.stdout.print(f"records: {files['records']}  summary: {files['summary_md']}")
    else:
        output.stdout.print("no phase ran; nothing was recorded")


def phase_names(text: str | None) -> tuple[str, ...]:
    """--phases as names; a value that names none ("", ",") is an error, not "every phase", and so is
    an empty name ("S1,,S8", "S1,")."""
    if text is None:
        return ()
    names = tuple(p.strip() for p in text.split(","))
    if not any(names):
        raise UsageError(f"--phases {text!r} names no phase; give names such as S1,S8, or drop --phases "
                         "to run every phase")
    if not all(names):
        raise UsageError(f"--phases takes comma-separated phase names, got {text!r}; drop the empty name")
    return names


def check_tokenizer_used(tokenizer: str | None, endpoint: str | None, dataset: str | None) -> None:
    """On the embedded runtime the tokenizer only counts the tokens of --dataset rows (synthetic
    prompts are random ids of the model's vocabulary): anywhere else it would be silently ignored."""
    if tokenizer is not None and not endpoint and not dataset:
        raise UsageError("--tokenizer applies to --dataset rows or --endpoint servers only; the embedded "
                         "runtime's synthetic prompts are random token ids: drop --tokenizer, or add --dataset")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
