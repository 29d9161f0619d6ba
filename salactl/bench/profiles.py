"""Benchmark profiles: TOML data files (shipped ones in the `salactl.profiles` package, or a user
PATH), validated into frozen dataclasses with one-line errors that name the file and the key.

Schema (version 1):
    name, description            strings
    mode                         "serving" (default) or "one-batch" (bench_one_batch-style grids)
    seed                         shuffle / synthetic-data seed (default 1, as SGLang; 0 .. 2^63-1)
    [dataset] kind               "soar" (a SOAR JSONL given with --dataset, else the synthetic
                                 SOAR-like mix) or "random" (exact token lengths)
              num_requests, input_len, output_len, range_ratio (the lengths and range_ratio are
              refused with kind "soar", here and in the phases: its mix or rows set the lengths)
    [scoring] method = "soar"; weights = {S1 = 0.4, ...} (keys are phase names)
    [[phases]] name; max_concurrency (int or "unlimited"); request_rate (req/s or "inf");
               burstiness (gamma shape, 1 = Poisson; only with a finite request_rate);
               num_requests; warmup_requests (default 1); flush_cache (default true);
               input_len / output_len / range_ratio (dataset overrides); batch_size (one-batch
               mode, where it is each phase's request count and concurrency: num_requests,
               max_concurrency, request_rate and burstiness are refused).
    num_requests sizes the synthetic sets; with --dataset every row runs in every phase, as SOAR's
    bench_serving.sh passes --num-prompts = the file's rows (--num-requests caps it).
    max_concurrency, request_rate, batch_size, input_len and output_len may be lists: the phase
    expands into the grid of their combinations (names get -c8 / -rate4 / -bs8 / -in1024 / -out16).
    Names keep the profile's lengths whatever --scale does to the prompts (they are the keys of
    --phases and of the scoring weights); the lengths that ran are in each record's
    knobs.dataset.input_len / output_len, and the bench table shows them. A phase asking for 2 or
    more output tokens measures decode (TPOT, ITL): bench refuses a --scale that leaves it one
    (bench.plan.check_decode_lengths); `output_len = 1` declares a prefill-only phase.
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from salactl.errors import ConfigError
from salactl.options import SEED_MAX
from salactl.runtime.json_file import check_regular_file, is_dir, lookup

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

GRID_KEYS = {"max_concurrency": "c", "request_rate": "rate", "batch_size": "bs",
             "input_len": "in", "output_len": "out"}
PHASE_KEYS = {"name", "max_concurrency", "request_rate", "burstiness", "num_requests",
              "warmup_requests", "flush_cache", "input_len", "output_len", "range_ratio", "batch_size"}
DATASET_KEYS = {"kind", "num_requests", "input_len", "output_len", "range_ratio"}
TOP_KEYS = {"name", "description", "mode", "seed", "dataset", "scoring", "phases"}
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
MAX_PROFILE_BYTES = 2**20       # profiles are a few hundred bytes of TOML
# keys a profile may not set where they would be ignored: the SOAR mix has its own lengths, and a
# one-batch phase sends its whole batch at once (its batch_size is its request count and concurrency)
SOAR_LENGTH_KEYS = ("input_len", "output_len", "range_ratio")
ONE_BATCH_SET_KEYS = ("num_requests", "max_concurrency", "request_rate", "burstiness")


@dataclass(frozen=True)
class Phase:
    name: str
    max_concurrency: int | None = None          # None = unlimited
    request_rate: float = math.inf
    burstiness: float = 1.0
    num_requests: int | None = None
    warmup_requests: int = 1
    flush_cache: bool = True
    input_len: int | None = None
    output_len: int | None = None
    range_ratio: float | None = None
    batch_size: int | None = None


@dataclass(frozen=True)
class Dataset:
    kind: str = "soar"
    num_requests: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    range_ratio: float = 0.0


@dataclass(frozen=True)
class Scoring:
    method: str = "soar"
    weights: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    mode: str
    seed: int
    dataset: Dataset
    phases: tuple[Phase, ...]
    scoring: Scoring | None
    source: str

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)


def shipped_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("salactl.profiles").iterdir()
                  if p.name.endswith(".toml"))


def load_profile(spec: str) -> Profile:
    """`spec` is a shipped profile name or a path to a TOML file. A bare name (no .toml, no
    directory part) is the shipped profile even when the working directory holds an entry of that
    name (`soar_bench.sh` makes an output directory called `soar`); other bare names are paths."""
    if not spec.strip():
        raise ConfigError(f"--profile is empty; give a shipped profile ({', '.join(shipped_profiles())}) "
                          "or a path to a .toml file")
    path = Path(spec)
    shipped = resources.files("salactl.profiles") / f"{spec}.toml"
    names_a_path = spec.endswith(".toml") or path.name != spec
    if not names_a_path and _is_file(shipped):
        text, source = shipped.read_text(encoding="utf-8"), spec
    elif names_a_path or lookup(path, ConfigError, "--profile") is not None:
        text, source = _read_profile_file(path), str(path)
    else:
        raise ConfigError(f"unknown profile {spec!r}; shipped profiles: {', '.join(shipped_profiles())}"
                          " (or give a path to a .toml file)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"profile {source} is not valid TOML ({e})") from None
    return parse_profile(data, source)


def _is_file(shipped) -> bool:
    """A shipped profile of that name exists; a name too long for the file system names none."""
    try:
        return shipped.is_file()
    except OSError:
        return False


def _read_profile_file(path: Path) -> str:
    shipped = f"shipped profiles: {', '.join(shipped_profiles())}"
    if is_dir(path, ConfigError, "--profile"):
        raise ConfigError(f"--profile {path} is a directory, not a .toml file; give the file, or one of the {shipped}")
    try:
        check_regular_file(path, ConfigError, 1 << 62, f"give a .toml file, or one of the {shipped}", "--profile")
        if path.stat().st_size > MAX_PROFILE_BYTES:
            raise ConfigError(f"--profile {path} is {path.stat().st_size:,} bytes, over the "
                              f"{MAX_PROFILE_BYTES // 2**20} MiB a profile may have; give a TOML profile file")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"profile file {path} does not exist; {shipped}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"--profile {path} is not UTF-8 text ({e.reason} at byte offset {e.start}); "
                          "give a TOML profile file") from None
    except OSError as e:
        raise ConfigError(f"cannot read --profile {path}: {e.strerror}; fix its permissions or give "
                          "another file") from None


class _Checker:
    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, msg: str):
        raise ConfigError(f"profile {self.source}: {where} {msg}")

    def unknown(self, table: dict, known: set[str], where: str) -> None:
        extra = sorted(set(table) - known)
        if extra:
            self.fail(where, f"has unknown key {extra[0]!r}; valid keys: {', '.join(sorted(known))}")

    def pos_int(self, v, where: str, allow_zero=False) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if allow_zero else 1):
            self.fail(where, f"must be a {'non-negative' if allow_zero else 'positive'} integer, got {v!r}")
        return v

    def pos_float(self, v, where: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            self.fail(where, f"must be a positive finite number, got {v!r}")
        return float(v)

    def concurrency(self, v, where: str) -> int | None:
        if v == "unlimited":
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            self.fail(where, f'must be a positive integer or "unlimited", got {v!r}')
        return v

    def rate(self, v, where: str) -> float:
        if v in ("inf", "infinity") or v == math.inf:
            return math.inf
        if isinstance(v, str):
            self.fail(where, f'must be a positive number of requests/s or "inf", got {v!r}')
        return self.pos_float(v, where)

    def ratio(self, v, where: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            self.fail(where, f"must be a number in [0, 1), got {v!r}")
        return float(v)


_CONVERT = {
    "max_concurrency": _Checker.concurrency,
    "request_rate": _Checker.rate,
    "burstiness": _Checker.pos_float,
    "num_requests": _Checker.pos_int,
    "warmup_requests": lambda c, v, w: c.pos_int(v, w, allow_zero=True),
    "input_len": _Checker.pos_int,
    "output_len": _Checker.pos_int,
    "batch_size": _Checker.pos_int,
    "range_ratio": _Checker.ratio,
}


def _label(v) -> str:
    if v is None:
        return "unlimited"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:g}"
    return str(v)


def _refuse_ignored(c: _Checker, raw: dict, where: str, mode: str, kind: str) -> None:
    """Keys this profile's kind or mode would silently ignore."""
    key = next((k for k in SOAR_LENGTH_KEYS if k in raw), None) if kind == "soar" else None
    if key is not None:
        c.fail(f"{where}.{key}", 'is ignored with kind = "soar" (the SOAR length mix, or the --dataset rows, '
                                 'set the lengths); drop it, or use kind = "random"')
    key = next((k for k in ONE_BATCH_SET_KEYS if k in raw), None) if mode == "one-batch" else None
    if key is not None:
        c.fail(f"{where}.{key}", "is set by batch_size in a one-batch profile (each phase sends one batch at "
                                 "once); drop it")


def _expand_phase(c: _Checker, raw: dict, i: int, mode: str, kind: str) -> list[Phase]:
    where = f"phases[{i}]"
    if not isinstance(raw, dict):
        c.fail(where, "must be a table")
    c.unknown(raw, PHASE_KEYS, where)
    _refuse_ignored(c, raw, where, mode, kind)
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        c.fail(f"{where}.name", f"must be a non-empty name of letters, digits, '_.+-', got {name!r}")
    values: dict = {}
    grid: dict[str, list] = {}
    for key, v in raw.items():
        if key == "name":
            continue
        if key == "flush_cache":
            if not isinstance(v, bool):
                c.fail(f"{where}.flush_cache", f"must be true or false, got {v!r}")
            values[key] = v
            continue
        if isinstance(v, list):
            if key not in GRID_KEYS:
                c.fail(f"{where}.{key}", "cannot be a list (lists are allowed for "
                                         f"{', '.join(GRID_KEYS)})")
            if not v:
                c.fail(f"{where}.{key}", "is an empty list")
            grid[key] = [_CONVERT[key](c, x, f"{where}.{key}[{j}]") for j, x in enumerate(v)]
        else:
            values[key] = _CONVERT[key](c, v, f"{where}.{key}")
    phases = []
    keys = list(grid)
    for combo in itertools.product(*(grid[k] for k in keys)):
        kv = dict(values, **dict(zip(keys, combo)))
        suffix = "".join(f"-{GRID_KEYS[k]}{_label(x)}" for k, x in zip(keys, combo))
        p = Phase(name=name + suffix, **kv)
        if mode == "one-batch":
            for need in ("batch_size", "input_len", "output_len"):
                if getattr(p, need) is None:
                    c.fail(where, f"needs {need} in a one-batch profile")
            p = Phase(**{**p.__dict__, "num_requests": p.batch_size, "max_concurrency": p.batch_size,
                         "request_rate": math.inf})
        elif p.batch_size is not None:
            c.fail(f"{where}.batch_size", 'is only valid with mode = "one-batch"')
        phases.append(p)
    # A grid cannot set burstiness per point: refuse it only where no point of the phase uses it.
    if mode != "one-batch" and "burstiness" in raw and all(math.isinf(p.request_rate) for p in phases):
        names = phases[0].name if len(phases) == 1 else f"{phases[0].name} (and every other point of its grid)"
        c.fail(f"{where}.burstiness", f"is ignored by phase {names}, whose request_rate is inf (every request "
                                      "leaves at t=0); drop it, or set a finite request_rate")
    return phases


def parse_profile(data: dict, source: str) -> Profile:
    c = _Checker(source)
    c.unknown(data, TOP_KEYS, "top level")
    mode = data.get("mode", "serving")
    if mode not in ("serving", "one-batch"):
        c.fail("mode", f'must be "serving" or "one-batch", got {mode!r}')
    seed = data.get("seed", 1)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        c.fail("seed", f"must be a non-negative integer of at most {SEED_MAX} (as --seed), got {seed!r}")
    ds_raw = data.get("dataset", {})
    if not isinstance(ds_raw, dict):
        c.fail("dataset", "must be a table")
    c.unknown(ds_raw, DATASET_KEYS, "[dataset]")
    kind = ds_raw.get("kind", "random" if mode == "one-batch" else "soar")
    if kind not in ("soar", "random"):
        c.fail("dataset.kind", f'must be "soar" or "random", got {kind!r}')
    if mode == "one-batch" and kind != "random":
        c.fail("dataset.kind", 'must be "random" in a one-batch profile')
    _refuse_ignored(c, ds_raw, "dataset", mode, kind)
    ds = Dataset(kind=kind, **{k: _CONVERT[k](c, v, f"dataset.{k}") for k, v in ds_raw.items() if k != "kind"})
    raw_phases = data.get("phases")
    if not isinstance(raw_phases, list) or not raw_phases:
        c.fail("phases", "must be a non-empty array of tables ([[phases]])")
    phases = [p for i, raw in enumerate(raw_phases) for p in _expand_phase(c, raw, i, mode, kind)]
    names = [p.name for p in phases]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        c.fail("phases", f"has two phases named {dup!r}; phase names must be unique")
    if kind == "random":
        for p in phases:
            if (p.input_len or ds.input_len) is None or (p.output_len or ds.output_len) is None:
                c.fail(f"phase {p.name}", "needs input_len and output_len (in the phase or [dataset]) "
                                          "for a random dataset")
    scoring = None
    if "scoring" in data:
        sc = data["scoring"]
        if not isinstance(sc, dict):
            c.fail("scoring", "must be a table")
        c.unknown(sc, {"method", "weights"}, "[scoring]")
        if sc.get("method", "soar") != "soar":
            c.fail("scoring.method", f'must be "soar", got {sc.get("method")!r}')
        weights = sc.get("weights")
        if not isinstance(weights, dict) or not weights:
            c.fail("scoring.weights", "must be a table of phase name = weight")
        for k, w in weights.items():
            if k not in names:
                c.fail(f"scoring.weights.{k}", f"names no phase; phases: {', '.join(names)}")
            c.pos_float(w, f"scoring.weights.{k}")
        scoring = Scoring("soar", {k: float(w) for k, w in weights.items()})
    desc = data.get("description", "")
    name = data.get("name", Path(source).stem)
    if not isinstance(desc, str) or not isinstance(name, str):
        c.fail("name/description", "must be strings")
    return Profile(name, desc, mode, seed, ds, tuple(phases), scoring, source)
