"""`salactl bench` as a function: validate everything, build the target, run the phases, append a
record per finished phase, and write the per-request CSV and summaries (also on Ctrl-C)."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from salactl import input_files, output
from salactl.bench import phase_checks
from salactl.bench import records as rec
from salactl.bench.metrics import one_batch_metrics, parse_slo, phase_metrics
from salactl.bench.plan import (check_decode_lengths, check_request_options, check_scale_and_cap, parse_dataset_spec,
                                plan_phases, read_datasets, select_phases)
from salactl.bench.profiles import load_profile
from salactl.bench.runner import run_phase
from salactl.bench.scoring import accuracy_coefficient, check_reference, parse_reference, soar_score
from salactl.bench.engine_options import check_gpu_engine_values, gpu_engine_sizes, refuse_gpu_engine_options
from salactl.bench.sweep_grid import KV_DTYPES, parse_name
from salactl.bench.open_files import check_open_files
from salactl.bench.targets.http import DEFAULT_READ_TIMEOUT_S
from salactl.errors import ConfigError, EndpointError, OutputWriteError, TokenizerError, UsageError
from salactl.options import refuse_unused
from salactl.reports.atomic import DiskFullError, move_all, write_atomic

FALLBACK_VOCAB = 1000   # random prompt ids for a server whose vocabulary we cannot learn
MAX_FLUSH_SLEEP_S = 3600.0                  # an hour; time.sleep overflows far above
MAX_REQUEST_TIMEOUT_S = 7 * 24 * 3600.0     # a week: within the 24.8-day socket wait the HTTP target clamps to


@dataclass(frozen=True)
class BenchSettings:
    profile: str = "soar"
    dataset: str | None = None
    skip_bad_rows: bool = False
    scale: float | None = None          # None: plan.DEFAULT_SCALE (None so that --dataset can refuse it)
    num_requests: int | None = None
    phases: tuple[str, ...] = ()
    endpoint: str | None = None
    backend: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    random_weights: bool = False
    seed: int | None = None     # None: weights seed 0, data from the profile's own seed
    device: str = "auto"
    dtype: str = "auto"
    chunk_size: int | None = None
    engine: str = "auto"
    kv_cache_dtype: str = "bf16"
    max_running_requests: int | None = None     # None: the GPU engine's defaults (refused on the reference)
    mem_fraction: float | None = None
    reference: str | None = None
    accuracy: float | None = None
    slo: str | None = None
    details: bool = False
    out: Path = Path("salactl-results")
    label: str | None = None
    flush_sleep: float = 1.0
    request_timeout: float = DEFAULT_READ_TIMEOUT_S   # total seconds one server request may take (0: no limit)
    given: frozenset[str] = frozenset()     # the fields set explicitly (on the command line): of these, the
                                            # other target's options are refused, whatever their value


@dataclass
class BenchRun:
    run_id: str
    settings: BenchSettings
    profile: str = ""
    target: str = ""
    model: str = ""
    phases: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    score: dict | None = None
    interrupted: bool = False
    stopped: str | None = None          # why the run ended early on an error
    files: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"run_id": self.run_id, "label": self.settings.label, "profile": self.profile,
             "target": self.target, "model": self.model, "phases": self.phases,
             "skipped_phases": self.skipped, "interrupted": self.interrupted, "files": self.files}
        if self.stopped:
            d["stopped"] = self.stopped
        if self.score is not None:
            d.update(score=self.score["score"], score_error=self.score["score_error"], score_details=self.score)
        return rec.jsonable(d)


def _tokenizer_for_http(s: BenchSettings):
    from salactl.runtime.tokenizer import Tokenizer

    if s.tokenizer:
        return Tokenizer(Path(s.tokenizer))
    if s.model and (Path(s.model) / "tokenizer.json").exists():
        return Tokenizer(Path(s.model))
    return None


def _vocab_for_http(s: BenchSettings, tokenizer) -> int:
    if tokenizer is not None:
        return tokenizer.vocab_size
    from salactl.runtime.presets import PRESETS, preset

    if s.model in PRESETS:
        return preset(s.model).vocab_size
    return _config_vocab(Path(s.model) / "config.json") if s.model else FALLBACK_VOCAB


def _config_vocab(path: Path) -> int:
    """vocab_size of any model's config.json (a server's --model is a name that may be the local
    checkpoint it serves, SALA or not); FALLBACK_VOCAB when there is no file or no positive count."""
    try:
        cfg = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return FALLBACK_VOCAB
    if not isinstance(cfg, dict):
        return FALLBACK_VOCAB
    text = cfg.get("text_config")           # multimodal configs keep the language model's vocabulary there
    vocab = cfg.get("vocab_size", text.get("vocab_size") if isinstance(text, dict) else None)
    return vocab if type(vocab) is int and vocab > 0 else FALLBACK_VOCAB


EMBEDDED_ONLY = {"random_weights": "--random-weights", "device": "--device", "dtype": "--dtype",
                 "chunk_size": "--chunk-size", "engine": "--engine", "kv_cache_dtype": "--kv-cache-dtype",
                 "max_running_requests": "--max-running-requests", "mem_fraction": "--mem-fraction"}
SERVER_ONLY = {"flush_sleep": "--flush-sleep", "request_timeout": "--request-timeout"}


def check_target_options(s: BenchSettings) -> None:
    """Options of the other kind of target that were given (s.given), whatever their value, would be
    silently ignored: name them instead."""
    if s.endpoint is not None:
        refuse_unused([flag for name, flag in EMBEDDED_ONLY.items() if name in s.given],
                      "the embedded runtime, not a server: set {it} on the server's own command line",
                      "drop {it}, or drop --endpoint", verb=("configures", "configure"))
    else:
        refuse_unused([flag for name, flag in SERVER_ONLY.items() if name in s.given],
                      "--endpoint servers only", "drop {it} for the embedded runtime")


def build_target(s: BenchSettings, need_tokenizer: bool):
    """Returns (target, tokenizer or None, vocab size for synthetic prompts, the model's
    max_position_embeddings or None for a server)."""
    if s.endpoint is not None:
        from salactl.bench.targets.http import HttpTarget

        tok = _tokenizer_for_http(s)
        backend = "sglang" if s.backend is None else s.backend
        target = HttpTarget(s.endpoint, backend, s.model, flush_sleep_s=s.flush_sleep,
                            read_timeout_s=s.request_timeout or None, tokenizer=tok)
        try:        # the probe starts the target's watchdog thread: a refused target must end it
            target.check()
            if need_tokenizer and tok is None:
                raise TokenizerError("counting the output tokens of SOAR rows needs the served model's "
                                     "tokenizer; pass --tokenizer PATH (tokenizer.json or its directory)")
        except BaseException:
            target.close()
            raise
        return target, tok, _vocab_for_http(s, tok), None
    if s.backend is not None:
        raise UsageError("--backend needs --endpoint URL (without one, the embedded engine is benchmarked)")
    from salactl.bench.targets.embedded import build_embedded_target
    from salactl.runtime.tokenizer import check_fits, find_tokenizer

    target, lm = build_embedded_target(s.model, s.random_weights, s.seed or 0, s.device, s.dtype, s.chunk_size,
                                       s.engine, s.kv_cache_dtype, s.max_running_requests, s.mem_fraction)
    tok = None
    if need_tokenizer:
        tok = find_tokenizer(s.tokenizer, lm.model_dir)
        try:
            check_fits(tok, lm.config.vocab_size)
        except TokenizerError:
            target.close()
            raise
    return target, tok, lm.config.vocab_size, lm.config.max_position_embeddings


def _phase_knobs(plan, s: BenchSettings, target, slo, cache_flushed: bool | None) -> dict:
    ph = plan.phase
    return {"max_concurrency": ph.max_concurrency, "request_rate": ph.request_rate,
            "burstiness": ph.burstiness, "warmup_requests": ph.warmup_requests,
            "flush_cache": ph.flush_cache, "cache_flushed": cache_flushed,
            "batch_size": ph.batch_size, "dataset": plan.dataset,
            # the lengths that ran (after --scale; None for SOAR's mixed rows), as sweep names them
            "input_len": plan.dataset.get("input_len"), "output_len": plan.dataset.get("output_len"),
            "num_requests_cap": s.num_requests, "skip_bad_rows": s.skip_bad_rows,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "slo_ms": slo or None,
            "seed": s.seed, "target": target.knobs()}


def check_settings(s: BenchSettings) -> None:
    """The options, before any model is loaded or server called (0 is never a default)."""
    check_scale_and_cap(s.scale, s.num_requests)
    if s.chunk_size is not None and s.chunk_size < 1:
        raise UsageError(f"--chunk-size must be a positive token count, got {s.chunk_size}")
    check_gpu_engine_values(s.max_running_requests, s.mem_fraction)
    rec.check_label(s.label)
    for flag, v, most, what in (
            ("--flush-sleep", s.flush_sleep, MAX_FLUSH_SLEEP_S, "an hour"),
            ("--request-timeout", s.request_timeout, MAX_REQUEST_TIMEOUT_S, "a week; 0: no limit")):
        if not (math.isfinite(v) and v >= 0):
            raise UsageError(f"{flag} must be a number of seconds >= 0, got {v}")
        if v > most:
            raise UsageError(f"{flag} must be at most {most:g} s ({what}), got {v:g}")
    if s.endpoint is not None and not s.endpoint.strip():
        raise UsageError("--endpoint is empty; give a server URL, or leave it out for the embedded runtime")
    if s.endpoint is not None and s.model is not None and not s.model.strip():
        raise UsageError("--model is empty; give the served model name, or drop --model to record the name "
                         "the server reports")
    check_target_options(s)
    if s.endpoint is None:
        check_embedded_options(s)


def check_embedded_options(s: BenchSettings) -> None:
    """The embedded runtime's options that its resolved engine would not use, or that name no KV dtype
    (bench and sweep take the same KV names; "bf16" and "auto" store the model's dtype, as in run)."""
    from salactl.bench.targets.embedded import resolve_engine
    from salactl.runtime.loader import resolve_device

    parse_name(s.kv_cache_dtype, "kv-cache-dtype", KV_DTYPES)
    refuse_gpu_engine_options(resolve_engine(s.engine, resolve_device(s.device)), s.max_running_requests,
                              s.mem_fraction)


def run_bench(s: BenchSettings, progress=None) -> BenchRun:
    from salactl.env import environment

    check_settings(s)
    profile = load_profile(s.profile)
    phases = select_phases(profile, list(s.phases))
    _check_some_phase_runs(phases, "embedded", _largest_batch_before_loading(s))
    check_request_options(profile, s.dataset, s.skip_bad_rows, s.scale, s.num_requests)
    check_decode_lengths(profile, phases, s.scale)
    reference = parse_reference(s.reference)
    weights = profile.scoring.weights if profile.scoring else {}
    if reference and not weights:
        raise UsageError(f"profile {profile.name} has no [scoring]; --reference only applies to scored profiles")
    check_reference(reference, weights)
    accuracy_coefficient(s.accuracy)
    if s.accuracy is not None and not reference:
        raise UsageError("--accuracy needs --reference (S1=SECONDS,...): it only scales the SOAR score, "
                         "which is computed against reference durations")
    slo = parse_slo(s.slo)
    spec = parse_dataset_spec(s.dataset, [p.name for p in profile.phases])
    parsed = read_datasets(spec, phases, s.skip_bad_rows)

    target, tok, vocab, trained_len = build_target(s, need_tokenizer=bool(spec))
    try:
        plans = plan_phases(profile, phases, spec, parsed, tok, vocab, s.scale, s.num_requests, s.seed)
        if s.endpoint is not None:
            check_open_files(plans)
        if trained_len is not None:
            _warn_past_trained_length(plans, trained_len)
        # the profile's file name and the model path or served name are the user's text: as UTF-8
        run = BenchRun(rec.new_run_id(), s, input_files.utf8_text(profile.name), target.kind,
                       target.model and input_files.utf8_text(target.model))
        return _execute(run, plans, profile, target, s, slo, reference, weights, environment(), progress)
    finally:
        target.close()


def _largest_batch_before_loading(s: BenchSettings) -> int | None:
    """The most requests the embedded engine will run at once, known from the options alone (None for
    a server, whose limit is its own)."""
    if s.endpoint is not None:
        return None
    from salactl.bench.targets.embedded import resolve_engine
    from salactl.runtime.loader import resolve_device

    if resolve_engine(s.engine, resolve_device(s.device)) == "reference":
        return 1
    return gpu_engine_sizes(s.max_running_requests, s.mem_fraction)[0]


def _skip_reason(batch: int | None, kind: str, largest: int | None) -> str | None:
    """Why a one-batch phase of `batch` requests cannot run on a target that runs `largest` at once
    (None: it can, or either is unknown)."""
    if not (batch and largest and batch > largest):
        return None
    why = f"batch {batch} > the {kind} target's largest batch ({largest})"
    if largest == 1:
        why += "; the reference engine serves one sequence at a time (use --engine gpu on CUDA to batch)"
    return why


def _nothing_measured(phase: str, why: str) -> ConfigError:
    """A run whose every phase is skipped measured nothing: a config error, as sweep's grid with no
    point it can measure."""
    return ConfigError(f"no phase could be measured ({phase}: {why}); nothing was recorded")


def _check_some_phase_runs(phases, kind: str, largest: int | None) -> None:
    """Before loading anything: refuse a selection of phases that the target would all skip."""
    reasons = [_skip_reason(ph.batch_size, kind, largest) for ph in phases]
    if phases and all(reasons):
        raise _nothing_measured(phases[-1].name, reasons[-1])


def _warn_past_trained_length(plans, limit: int) -> None:
    """As run does: once, for the longest request (prompt plus output) of all the phases."""
    plan, req = max(((p, r) for p in plans for r in p.requests), key=lambda pr: pr[1].input_len + pr[1].output_len)
    where = f"phase {plan.phase.name}" if req.source_line is None else f"{plan.dataset['path']}:{req.source_line}"
    output.warn_past_trained_length(req.input_len + req.output_len, limit,
                                    f"the longest request ({where}, input plus output)")


def _execute(run, plans, profile, target, s, slo, reference, weights, env, progress) -> BenchRun:
    out = Path(s.out)
    writer = rec.RecordWriter(out / rec.RECORDS_NAME)
    details = []
    durations: dict[str, float] = {}
    problems: dict[str, str] = {}
    side_files_failed = False
    try:
        for plan in plans:
            ph = plan.phase
            why = _skip_reason(ph.batch_size, target.kind, target.max_batch_size)
            if why is not None:
                run.skipped.append({"phase": ph.name, "reason": why})
                output.stderr.print(f"note: skipping phase {ph.name}: {why}")
                continue
            outcome = run_phase(target, ph, plan.requests, seed=plan.dataset["seed"], progress=progress)
            failed = phase_checks.all_failed(ph.name, outcome.results)
            if failed:
                raise EndpointError(f"{failed}; {_finished_files_note(run, out)}")
            phase_checks.warn_failures(ph.name, outcome.results, s.details)
            phase_checks.warn_short(ph.name, outcome.results)
            phase_checks.warn_estimated(ph.name, outcome.results)
            phase_checks.warn_over_max(ph.name, outcome.results)
            problem = phase_checks.score_problem(outcome.results)
            metrics = phase_metrics(outcome.results, outcome.duration, slo)
            metrics.update(phase_checks.count_fields(outcome.results))
            metrics.update(max_concurrency=ph.max_concurrency, request_rate=ph.request_rate,
                           burstiness=ph.burstiness, num_prompts=len(plan.requests))
            if profile.mode == "one-batch":
                metrics.update(one_batch_metrics(outcome.results, outcome.duration, ph.batch_size,
                                                 plan.dataset["input_len"], plan.dataset["output_len"]))
            metrics.update(outcome.device)
            if reference and ph.name in weights:
                metrics.update(score_weight=weights[ph.name], score_reference_duration=reference[ph.name],
                               score_tier=None if problem else reference[ph.name] / outcome.duration * 100.0,
                               score_error=problem)
            rows = []
            if s.details and outcome.results:
                rows = rec.detail_rows(run.run_id, outcome.results, min(r.start_time for r in outcome.results))
                metrics["details_csv"] = out / f"{run.run_id}-requests.csv"
            record = rec.make_record("bench", run.run_id, s.label, run.profile, ph.name, target.kind,
                                     run.model, metrics,
                                     _phase_knobs(plan, s, target, slo, outcome.cache_flushed), env,
                                     outcome.started_at)
            with rec.interrupts_deferred():     # the summaries written on the way out cover every record
                run.phases.append(record)
                # listed once a record goes in: a run whose phases were all skipped writes no file
                run.files["records"] = writer.path     # paths stay paths: jsonable names them as UTF-8
                details += rows
                side_files_error = _side_files_before_record(run, out, details, record) if rows else None
                writer.append(record)
                if side_files_error is not None:
                    side_files_failed = True
                    raise side_files_error
                durations[ph.name] = outcome.duration
                if problem:
                    problems[ph.name] = problem
    except KeyboardInterrupt:
        run.interrupted = True
        raise
    except EndpointError as e:
        run.stopped = str(e)
        raise
    finally:
        with rec.interrupts_deferred():         # a second interrupt waits for the files of the first
            if reference and weights:
                run.score = soar_score(durations, reference, weights, s.accuracy, problems)
            if run.phases and not side_files_failed:        # nothing finished: leave no files behind
                _write_side_files(run, out, details)
    if not run.phases and run.skipped:
        raise _nothing_measured(run.skipped[-1]["phase"], run.skipped[-1]["reason"])
    if run.score is not None and run.score["score_error"]:
        output.warn_once(f"SOAR score not computed: {run.score['score_error']}")
    return run


def _finished_files_note(run: BenchRun, out: Path) -> str:
    """Where the phases that finished before a failed one are kept (written on the way out)."""
    if not run.phases:
        return "no phase finished, so nothing was written"
    names = ", ".join(p["phase"] for p in run.phases)
    return (f"the finished phases ({names}) are in {out / rec.RECORDS_NAME} and "
            f"{out / run.run_id}.md/.json")


def _side_files_before_record(run: BenchRun, out: Path, details: list, record: dict) -> OutputWriteError | None:
    """Write the side files (the CSV with this phase's rows) before `record` is appended, so that its
    details_csv names a file in place; where they cannot be written, the record names no CSV and says
    why, and the error is returned for the caller to raise once the record is on disk."""
    try:
        _write_side_files(run, out, details)
    except OutputWriteError as e:
        record["details_csv"] = None
        record["details_error"] = str(e)
        return e
    return None


def _write_side_files(run: BenchRun, out: Path, details: list) -> None:
    """The per-request CSV, plots and summaries, all or none: written into a staging directory in
    `out`, then moved in together (records.jsonl, appended as each phase ends, is not among them)."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{run.run_id}.tmp-", dir=out))
    try:
        _stage_side_files(run, out, staging, details)
        move_all(staging, out)
    except DiskFullError as e:
        if e.path.parent != staging:
            raise
        raise DiskFullError(out / e.path.name, e.error) from e      # the output's name, not the staging one
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _stage_side_files(run: BenchRun, out: Path, staging: Path, details: list) -> None:
    """Write the side files into `staging`; run.files names them where they will be, in `out`."""
    from salactl.bench import report_plots
    from salactl.bench.summary import markdown_summary

    plots = [report_plots.throughput_plot(run.phases, staging / f"{run.run_id}-throughput.png")]
    if details:
        csv = staging / f"{run.run_id}-requests.csv"
        rec.write_details(csv, details)
        run.files["details"] = out / csv.name
        per_request = report_plots.read_details(csv)
        plots.append(report_plots.cdf_plot(per_request, staging / f"{run.run_id}-latency-cdf.png"))
        plots.append(report_plots.ttft_vs_input_plot(per_request, staging / f"{run.run_id}-ttft-vs-input.png"))
    run.files["plots"] = [out / p.name for p in plots if p is not None]
    run.files["summary_md"] = out / f"{run.run_id}.md"
    run.files["summary_json"] = out / f"{run.run_id}.json"
    write_atomic(staging / f"{run.run_id}.md", markdown_summary(run.to_dict()))
    write_atomic(staging / f"{run.run_id}.json", json.dumps(run.to_dict(), indent=2) + "\n")
