"""Turn a profile + command-line choices into the request list of every phase (before anything
runs, so bad input fails with nothing written)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from salactl import output
from salactl.bench.datasets import read_soar_rows, soar_requests
from salactl.bench.profiles import Phase, Profile
from salactl.bench.requests import BenchRequest
from salactl.bench.synthetic import random_lengths, scaled, soar_like
from salactl.errors import DatasetError, UsageError

DEFAULT_SYNTHETIC_REQUESTS = 96
DEFAULT_SCALE = 1.0
BENCH_SIZE_FIX = "lower --scale or --num-requests (or the profile's lengths)"


@dataclass
class PhasePlan:
    phase: Phase
    requests: list[BenchRequest]
    dataset: dict                       # how the requests were made (goes into the record's knobs)


def parse_dataset_spec(spec: str | None, phase_names: list[str]) -> dict[str | None, Path]:
    """`FILE` (every phase) or `S1=a.jsonl,S8=b.jsonl` (per phase). Key None = every phase."""
    if not spec:
        return {}
    parts = spec.split(",")
    if all("=" in p for p in parts) and all(p.split("=", 1)[0] in phase_names for p in parts):
        files = {p.split("=", 1)[0]: p.split("=", 1)[1] for p in parts}
        empty = next((name for name, f in files.items() if not f.strip()), None)
        if empty is not None:
            raise UsageError(f"--dataset {empty}= names no file; give {empty}=PATH")
        return {name: Path(f) for name, f in files.items()}
    keys = [p.split("=", 1)[0] for p in parts if "=" in p]
    # one PATH may hold "=" (e.g. data=v2.jsonl); a key without "/" that names no file is a phase
    if (len(parts) > 1 and keys) or (keys and "/" not in keys[0] and not Path(spec).exists()):
        bad = next((k for k in keys if k not in phase_names), None)
        if bad is None:
            raise UsageError(f"--dataset {spec} mixes PHASE=FILE and FILE; give one file for every phase "
                             "or PHASE=FILE for each")
        if len(parts) == 1:              # a missing file whose name holds "=", or a phase misspelt
            raise DatasetError(f"dataset {spec} does not exist, and {bad!r} is not a phase of the profile "
                               f"({', '.join(phase_names)}); give a JSONL file or PHASE=FILE")
        raise UsageError(f"--dataset names phase {bad!r}, which the profile lacks; phases: {', '.join(phase_names)}")
    return {None: Path(spec)}


def select_phases(profile: Profile, names: list[str] | None) -> list[Phase]:
    if not names:
        return list(profile.phases)
    known = [p.name for p in profile.phases]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--phases names {unknown[0]!r}, which profile {profile.name} lacks; phases: {', '.join(known)}")
    return [p for p in profile.phases if p.name in names]


def read_datasets(spec: dict[str | None, Path], phases: list[Phase], skip_bad_rows: bool):
    """Strictly parse every dataset file once; returns {path: (rows, report)}."""
    if None not in spec and spec:
        missing = [p.name for p in phases if p.name not in spec]
        if missing:
            raise UsageError(f"--dataset gives no file for phase {missing[0]}; give one file for all "
                             "phases or PHASE=FILE for each")
    needed = dict.fromkeys(spec.get(p.name, spec.get(None)) for p in phases) if spec else {}
    parsed = {path: read_soar_rows(path, skip_bad_rows) for path in needed}
    for path, (_, report) in parsed.items():
        if report.bad_rows:
            more = ", ..." if report.bad_rows > len(report.bad_lines) else ""
            lines = ", ".join(map(str, report.bad_lines)) + more
            output.warn_once(f"skipped {report.bad_rows} malformed rows of {path} (lines {lines})")
    return parsed


def check_scale_and_cap(scale: float | None, cap: int | None) -> None:
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise UsageError(f"--scale must be a positive number, got {scale}")
    if cap is not None and cap < 1:
        raise UsageError(f"--num-requests must be positive, got {cap}")


def check_request_options(profile: Profile, dataset: str | None, skip_bad_rows: bool, scale: float | None,
                          cap: int | None) -> None:
    """Options that shape requests this profile and --dataset would not make (silently ignored
    otherwise). `scale`/`cap` are None when not given."""
    if dataset and profile.mode == "one-batch":
        raise UsageError(f"profile {profile.name} is a one-batch grid of random prompts; it takes no --dataset")
    if skip_bad_rows and not dataset:
        raise UsageError("--skip-bad-rows drops malformed --dataset rows, and without --dataset the prompts "
                         "are synthetic: drop --skip-bad-rows, or add --dataset")
    if scale is not None and dataset:
        raise UsageError("--scale scales the lengths of synthetic prompts; --dataset rows keep their own "
                         "lengths: drop --scale, or drop --dataset")
    if cap is not None and profile.mode == "one-batch":
        names = ", ".join(p.name for p in profile.phases)
        raise UsageError(f"--num-requests does not apply to profile {profile.name}: each phase is one batch, "
                         f"whose batch size sets its request count ({names}); drop --num-requests, and pick "
                         "batch sizes with --phases")


def scaled_length(length: int, scale: float) -> int:
    """A random-dataset length after --scale (at least 1 token)."""
    return scaled(length, scale, least=1)


def smallest_scale(length: int, tokens: int) -> float:
    """The least --scale, rounded up to 3 significant digits, that scales `length` to `tokens` or more."""
    exact = (tokens - 0.5) / length          # round() gives `tokens` from tokens - 0.5 up (half to even)
    step = 10.0 ** (math.floor(math.log10(exact)) - 2)
    scale = float(f"{math.ceil(exact / step) * step:.3g}")
    while scaled_length(length, scale) < tokens:     # float rounding of the product
        scale = float(f"{scale + step:.3g}")
    return scale


def check_decode_lengths(profile: Profile, phases: list[Phase], scale: float | None) -> None:
    """A random-dataset phase asking for 2+ output tokens measures decode (TPOT, ITL); a --scale that
    leaves it one token would record those as null, so it is refused. (SOAR's synthetic mix keeps 2+.)"""
    if profile.dataset.kind != "random" or scale is None:
        return
    asked = {ph.name: ph.output_len or profile.dataset.output_len or 0 for ph in phases}
    short = [name for name, n in asked.items() if n >= 2 and scaled_length(n, scale) < 2]
    if short:
        name, more = short[0], len(short) - 1
        others = f" ({more} more phase{'s' if more > 1 else ''} too)" if more else ""
        least = max(smallest_scale(asked[n], 2) for n in short)
        raise UsageError(f"--scale {scale:g} scales the output of phase {name} from {asked[name]} to "
                         f"{scaled_length(asked[name], scale)} token{others}, too few for its TPOT and ITL "
                         f"(2 or more): use --scale {least:g} or more")


def plan_phases(profile: Profile, phases: list[Phase], spec: dict[str | None, Path], parsed: dict,
                tokenizer, vocab_size: int, scale: float | None, cap: int | None,
                seed: int | None = None) -> list[PhasePlan]:
    """`seed` (--seed) replaces the profile's seed for the shuffle and synthetic data; `scale`
    None is DEFAULT_SCALE."""
    check_scale_and_cap(scale, cap)
    scale = DEFAULT_SCALE if scale is None else scale
    ds = profile.dataset
    seed = profile.seed if seed is None else seed
    tokenized = {path: {} for path in parsed}       # each file's rows tokenized once, for every phase
    plans = []
    for ph in phases:
        prefix = f"{ph.name}-"
        if spec:
            path = spec.get(ph.name, spec.get(None))
            rows, report = parsed[path]
            reqs, too_short = soar_requests(rows, tokenizer, seed=seed, limit=cap, prefix=prefix,
                                            cache=tokenized[path], path=path)
            if not reqs:
                raise DatasetError(f"every row of {path} is under 2 tokens; nothing to benchmark: give rows whose question has text")
            info = {"kind": "soar-jsonl", "path": str(path), "rows": report.rows,
                    "bad_rows_skipped": report.bad_rows, "bad_rows_first_lines": list(report.bad_lines),
                    "too_short_dropped": too_short}
        elif ds.kind == "soar":
            n = min(ph.num_requests or ds.num_requests or DEFAULT_SYNTHETIC_REQUESTS, cap or 10**9)
            reqs = soar_like(n, scale, vocab_size, seed=seed, prefix=prefix, fix=BENCH_SIZE_FIX)
            info = {"kind": "soar-synthetic", "scale": scale}
        else:
            n = ph.batch_size if profile.mode == "one-batch" else min(
                ph.num_requests or ds.num_requests or DEFAULT_SYNTHETIC_REQUESTS, cap or 10**9)
            in_len = scaled_length(ph.input_len or ds.input_len, scale)
            out_len = scaled_length(ph.output_len or ds.output_len, scale)
            ratio = ph.range_ratio if ph.range_ratio is not None else ds.range_ratio
            reqs = random_lengths(n, in_len, out_len, vocab_size, ratio, seed=seed, prefix=prefix,
                                  fix=BENCH_SIZE_FIX)
            info = {"kind": "random", "scale": scale, "input_len": in_len, "output_len": out_len,
                    "range_ratio": ratio}
        info.update(seed=seed, num_requests=len(reqs), vocab_size=vocab_size if not spec else None)
        plans.append(PhasePlan(ph, reqs, info))
    return plans
