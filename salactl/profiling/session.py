"""One `salactl profile` session as a function: pick the mode, run it, join the measurements with
the analytic model, and return the result record (the CLI only parses options and renders)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from salactl import output
from salactl.errors import DeviceError, ProfilerPermissionError, ToolMissingError, UsageError
from salactl.options import refuse_unused
from salactl.profiling.ncu_runner import NcuOptions, export_csv, find_ncu, nvtx_includes, run_ncu
from salactl.profiling.spec import ProfileSpec
from salactl.profiling.step_runner import write_json
from salactl.reports.ncu import parse_csv
from salactl.reports.profile_table import from_ncu, in_scopes, kernel_rows, op_rows

MODES = ("auto", "ncu", "torch")
# every file a session may write in its directory (--ncu or --torch)
OUTPUT_FILES = ("result.json", "step.json", "spec.json", "trace.json", "profile.ncu-rep", "profile.csv",
                "ncu.log")


@dataclass(frozen=True)
class SessionOptions:
    mode: str = "auto"
    nvml: bool = False
    out_dir: Path = Path("salactl-profile")
    ncu_path: str | None = None
    ncu: NcuOptions = NcuOptions()
    top: int = 20
    ncu_given: tuple[str, ...] = ()     # Nsight Compute flags given explicitly: ask for an ncu profile


def peaks_for_name(name: str, device_type: str, dtype: str | None) -> dict:
    """The ceilings, with the matmul rate of the profiled model's dtype as `compute_tflops`."""
    import torch

    from salactl.runtime.peaks import peaks_by_name

    return peaks_by_name(name, device_type).for_dtype(torch.float32 if dtype == "float32" else torch.bfloat16)


def tables(samples, manifest: dict, peaks: dict, top: int) -> dict:
    analytic = {p: s["analytic"] for p, s in manifest["steps"].items()}
    samples = [s for s in samples if s.phase not in manifest["steps"]
               or in_scopes(s, manifest["steps"][s.phase].get("scopes"))]
    ops = op_rows(samples, analytic, peaks["mem_gbps"], peaks["compute_tflops"])
    kernels = kernel_rows(samples, peaks["mem_gbps"], top)
    return {"ops": [r.to_dict() for r in ops], "kernels": [r.to_dict() for r in kernels],
            "kernel_count": len(samples)}        # in the profiled scope (--layers), not every launch


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_mode(mode: str, spec: ProfileSpec, ncu_path: str | None, ncu_given: tuple[str, ...]) -> str:
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    return pick_mode(mode, spec.device != "cpu" and _cuda_available(), ncu_path, ncu_given)


def pick_mode(mode: str, gpu: bool, ncu_path: str | None, ncu_given: tuple[str, ...]) -> str:
    """The profile that runs: ncu or torch. Auto runs ncu on a CUDA GPU where ncu is found, else torch.
    ncu_given: the Nsight Compute options given explicitly, refused where no ncu profile runs."""
    if mode == "ncu":
        if not gpu:
            raise DeviceError("--ncu needs a CUDA GPU and none is visible (or --device cpu was "
                              "given); use --torch, which also runs on CPU")
        find_ncu(ncu_path)
        return "ncu"
    if mode == "torch":
        _refuse_ncu_options(ncu_given, "--torch runs torch.profiler: drop {it}, or use --ncu instead of --torch")
        return "torch"
    if not gpu:
        _refuse_ncu_options(ncu_given, "auto mode runs torch.profiler here (no CUDA GPU, or --device cpu): "
                            "drop {it}")
        return "torch"
    try:
        find_ncu(ncu_path)
        return "ncu"
    except ToolMissingError as e:
        if ncu_path:            # the ncu named is missing: that is the error, not a fallback
            raise
        _refuse_ncu_options(ncu_given, "auto mode runs torch.profiler here, as ncu was not found: drop {it}, "
                            "or put ncu on PATH (or pass --ncu-path)")
        output.stderr.print(f"warning: {e}; falling back to --torch")
        return "torch"


def _refuse_ncu_options(flags: tuple[str, ...], instead: str) -> None:
    refuse_unused(list(flags), "Nsight Compute profiles only", instead)


def run(spec: ProfileSpec, opts: SessionOptions) -> dict:
    """Profile into a staging directory beside --out and move its files into --out only when the
    whole session succeeded, so an interrupted or failed run leaves no partial profile behind."""
    from salactl.reports.atomic import move_all

    mode = resolve_mode(opts.mode, spec, opts.ncu_path, opts.ncu_given)    # a mode that cannot run fails before any file exists
    final = opts.out_dir
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        result = _run(spec, replace(opts, out_dir=staging), mode)
        result["out_dir"] = str(final)
        result["files"] = {k: str(final / Path(v).name) for k, v in result.get("files", {}).items()}
        result["files"]["result"] = str(final / "result.json")
        write_json(staging / "result.json", result)
        move_all(staging, final, overwrite=True)     # check_out_dir vetted --out before the work
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run(spec: ProfileSpec, opts: SessionOptions, mode: str) -> dict:
    t0 = time.perf_counter()
    out = opts.out_dir
    sampler = nullcontext()
    if opts.nvml:
        from salactl.profiling.nvml_sampler import NvmlSampler

        sampler = NvmlSampler()
    result: dict = {"mode": mode, "out_dir": str(out)}
    with sampler:
        if mode == "ncu":
            try:
                result.update(_run_ncu(spec, opts))
            except ProfilerPermissionError as e:
                if opts.mode != "auto" or opts.ncu_given:    # torch would ignore the ncu options given
                    raise
                output.stderr.print(f"warning: {e}; falling back to --torch")
                mode = result["mode"] = "torch"
        if mode == "torch":
            result.update(_run_torch(spec, opts))
    if opts.nvml:
        result["nvml"] = sampler.summary()
    result["elapsed_s"] = time.perf_counter() - t0
    return result


def _run_ncu(spec: ProfileSpec, opts: SessionOptions) -> dict:
    ncu = find_ncu(opts.ncu_path)
    out = opts.out_dir
    out.mkdir(parents=True, exist_ok=True)
    spec_path, manifest_path = out / "spec.json", out / "step.json"
    spec.write(spec_path)
    output.stderr.print(f"profiling {', '.join(spec.phases)} of {spec.model} under {ncu} ...")
    report, csv_path = run_ncu(ncu, out, nvtx_includes(spec.phases, spec.scopes), spec_path,
                               manifest_path, opts.ncu, out / "ncu.log")
    return load_saved(out, opts.top) | {"files": {"ncu_report": str(report), "csv": str(csv_path),
                                                   "manifest": str(manifest_path)}}


def load_saved(out: Path, top: int = 20) -> dict:
    """Tables from a saved ncu profile directory (profile.csv + step.json)."""
    manifest_path, csv_path = out / "step.json", out / "profile.csv"
    if not csv_path.exists() and (out / "profile.ncu-rep").exists():
        export_csv(find_ncu(None), out / "profile.ncu-rep", csv_path)
    for p in (manifest_path, csv_path):
        if not p.exists():
            raise UsageError(f"{p} is missing; a saved profile directory holds step.json and "
                             "profile.csv (written by salactl profile --ncu)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as e:
        raise UsageError(f"{manifest_path} is not valid JSON ({e.msg})") from None
    kernels = parse_csv(csv_path)
    peaks = peaks_for_name(manifest["device_name"], manifest["device"].split(":")[0], manifest.get("dtype"))
    samples = from_ncu(kernels)
    return {"mode": "ncu", "manifest": manifest, "peaks": peaks,
            **tables(samples, manifest, peaks, top)}


def _run_torch(spec: ProfileSpec, opts: SessionOptions) -> dict:
    from salactl.profiling.step_runner import describe
    from salactl.profiling.torch_mode import profile_torch
    from salactl.profiling.workload import build

    output.stderr.print(f"profiling {', '.join(spec.phases)} of {spec.model} with torch.profiler ...")
    w = build(spec)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    trace = opts.out_dir / "trace.json"
    samples, seconds = profile_torch(w, trace)
    manifest = describe(w, seconds)
    write_json(opts.out_dir / "step.json", manifest)
    peaks = peaks_for_name(manifest["device_name"], w.device.type, manifest.get("dtype"))
    return {"manifest": manifest, "peaks": peaks,
            "files": {"chrome_trace": str(trace), "manifest": str(opts.out_dir / "step.json")},
            **tables(samples, manifest, peaks, opts.top)}
