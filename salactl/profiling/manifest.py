"""A saved ncu profile's manifest (step.json) for `profile --import`: its shape checked before the
tables read it, so a JSON file that is not a manifest is a one-line usage error, not a KeyError."""

from __future__ import annotations

from pathlib import Path

from salactl.errors import UsageError
from salactl.reports.ncu import GZIP_MAGIC
from salactl.reports.records import is_finite_number
from salactl.runtime.json_file import MAX_SIDE_FILE, cannot_read, check_regular_file, read_json

MANIFEST_KEYS = ("source", "device", "device_name", "dtype", "kv_dtype", "steps")
STEP_KEYS = ("new_tokens", "cached_tokens", "batch", "analytic")


def read_ncu_manifest(path: Path) -> dict:
    """step.json of an ncu profile, its shape checked (one-line usage errors, not a KeyError later).
    A manifest without `mode` predates the key, which only ncu manifests were imported with."""
    manifest = _read_manifest_json(path)
    problem = manifest_problem(manifest)
    if problem:
        raise UsageError(f"{path} is not a salactl profile manifest: {problem}; give a directory written by "
                         "salactl profile --ncu")
    mode = manifest.get("mode", "ncu")
    if mode != "ncu":
        raise UsageError(f"{path} is the manifest of a {mode} profile, not an ncu one; --import re-renders "
                         "--ncu profiles only (a --torch profile's tables are in its result.json)")
    return manifest


_FIX = "give a directory written by salactl profile --ncu"


def _read_manifest_json(path: Path) -> object:
    """The parsed step.json: missing, unreadable, not a regular file (a FIFO would block), gzip-compressed,
    not UTF-8 or not JSON each a one-line usage error."""
    try:
        check_regular_file(path, UsageError, MAX_SIDE_FILE, _FIX)
        if _is_gzip(path):
            raise UsageError(f"{path} is gzip-compressed; gunzip it first")
        return read_json(path, UsageError, _FIX)
    except FileNotFoundError:
        raise UsageError(f"{path} is missing; a saved profile directory holds step.json and profile.csv "
                         "(written by salactl profile --ncu)") from None
    except OSError as e:
        raise cannot_read(path, e, UsageError, _FIX) from None


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(GZIP_MAGIC)) == GZIP_MAGIC


def manifest_problem(m) -> str | None:
    """What makes `m` not a manifest the tables can read, or None."""
    if not isinstance(m, dict):
        return f"it holds a JSON {type(m).__name__}, not an object"
    missing = [k for k in MANIFEST_KEYS if k not in m]
    if missing:
        return f"it has no {', '.join(missing)}"
    wrong = [k for k in ("source", "device", "device_name", "dtype", "kv_dtype", "mode")
             if k in m and not isinstance(m[k], str)]
    if wrong:
        return f"{', '.join(wrong)} must be strings"
    config = m.get("config", {})
    if not isinstance(config, dict):
        return "config is not an object"
    mixers = config.get("mixer_types", [])
    if not (isinstance(mixers, list) and all(isinstance(x, str) for x in mixers)):
        return "config.mixer_types is not a list of names"
    if not isinstance(m["steps"], dict) or not m["steps"]:
        return "steps is not an object of phases"
    for phase, step in m["steps"].items():
        problem = _step_problem(phase, step)
        if problem:
            return problem
    return None


def _step_problem(phase: str, step) -> str | None:
    from salactl.reports.profile_table import PHASES

    if phase not in PHASES:
        return f"steps has the unknown phase {phase!r} (valid: {', '.join(PHASES)})"
    if not isinstance(step, dict):
        return f"steps.{phase} is not an object"
    missing = [k for k in STEP_KEYS if k not in step]
    if missing:
        return f"steps.{phase} has no {', '.join(missing)}"
    scopes = step.get("scopes")
    if scopes is not None and not (isinstance(scopes, list) and all(isinstance(x, str) for x in scopes)):
        return f"steps.{phase}.scopes is not a list of names"
    by_scope = step.get("analytic_by_scope", {})
    if not isinstance(by_scope, dict):
        return f"steps.{phase}.analytic_by_scope is not an object"
    costs = {f"steps.{phase}.analytic": step["analytic"],
             **{f"steps.{phase}.analytic_by_scope.{k}": v for k, v in by_scope.items()}}
    return next(filter(None, (_costs_problem(c, where) for where, c in costs.items())), None)


def _costs_problem(costs, where: str) -> str | None:
    """Analytic costs: {op class: {"bytes": number, "flops": number}} for every op class, with an
    optional number bf16_flops (the quantized linears' share of flops); none negative."""
    from salactl.runtime.roofline import OP_CLASSES

    if not isinstance(costs, dict) or any(op not in costs for op in OP_CLASSES):
        return f"{where} is not an object with the op classes {', '.join(OP_CLASSES)}"
    for op, c in costs.items():
        if not (isinstance(c, dict) and all(is_finite_number(c.get(k)) for k in ("bytes", "flops"))):
            return f"{where}.{op} is not an object with numbers bytes and flops"
        if "bf16_flops" in c and not is_finite_number(c["bf16_flops"]):
            return f"{where}.{op}.bf16_flops is not a number"
        negative = next((k for k in ("bytes", "flops", "bf16_flops") if k in c and c[k] < 0), None)
        if negative:
            return f"{where}.{op}.{negative} is negative ({c[negative]})"
    return None
