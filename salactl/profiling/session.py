"""One `salactl profile` session as a function: pick the mode, run it, join the measurements with
the analytic model, and return the result record (the CLI only parses options and renders)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from salactl import out_dirs, output
from salactl.bench.out_of_memory import out_of_memory_is_capacity
from salactl.bench.records import interrupts_deferred
from salactl.errors import (DeviceError, OutputWriteError, ProfilerFailedError, ProfilerPermissionError,
                            ToolMissingError, UsageError)
from salactl.options import refuse_unused
from salactl.profiling.ncu_runner import (NcuOptions, export_command, export_text, find_ncu, installed_ncu,
                                          nvtx_includes, run_ncu)
from salactl.profiling.manifest import read_ncu_manifest
from salactl.profiling.spec import ProfileSpec
from salactl.profiling.step_runner import write_json
from salactl.reports.atomic import (DiskFullError, check_destinations, exclusive_lock, free_space, move_all,
                                     write_atomic, write_remedy)
from salactl.reports.ncu import parse_csv, parse_csv_text
from salactl.reports.profile_table import from_ncu, in_scopes, kernel_rows, layer_rows, op_rows, overcounted

MODES = ("auto", "ncu", "torch")
# every file a session may write in its directory (--ncu or --torch)
OUTPUT_FILES = ("result.json", "step.json", "spec.json", "trace.json", "profile.ncu-rep", "profile.csv",
                "ncu.log")
PROFILE_LOCK = ".salactl-profile.lock"     # in --out while a profile's files move in
# a failed write that says the disk (or file system) is the problem, wherever in the session it happens
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


@dataclass(frozen=True)
class SessionOptions:
    mode: str = "auto"
    nvml: bool = False
    out_dir: Path = Path("salactl-profile")
    ncu_path: str | None = None
    ncu: NcuOptions = NcuOptions()
    top: int = 20
    ncu_given: tuple[str, ...] = ()     # Nsight Compute flags given explicitly: ask for an ncu profile
    overwrite: bool = False             # --overwrite: replace a profile in out_dir, even one written meanwhile


def peaks_for_name(name: str, device_type: str, dtype: str | None, quantized: bool = False) -> dict:
    """The ceilings, with the matmul rate of the profiled model's dtype as `compute_tflops`; `quantized`
    (some FLOPs compute in bf16 whatever that dtype) adds the bf16 rate where it differs."""
    import torch

    from salactl.runtime.peaks import peaks_by_name

    dt = torch.float32 if dtype == "float32" else torch.bfloat16
    return peaks_by_name(name, device_type).for_dtype(dt, quantized=quantized)


def manifest_peaks(manifest: dict, device_type: str) -> dict:
    """The ceilings of a manifest's profile: quantized where its analytic costs count bf16 FLOPs
    (so --import of an ncu profile gets the rates its session rendered; a manifest written before
    they were counted keeps the one rate it had)."""
    quantized = any(c.get("bf16_flops") for step in manifest["steps"].values() for c in step["analytic"].values())
    return peaks_for_name(manifest["device_name"], device_type, manifest.get("dtype"), quantized)


def tables(samples, manifest: dict, peaks: dict, top: int) -> dict:
    steps = manifest["steps"]
    analytic = {p: s["analytic"] for p, s in steps.items()}
    samples = [s for s in samples if s.phase not in steps or in_scopes(s, steps[s.phase].get("scopes"))]
    rates = peaks["mem_gbps"], peaks["compute_tflops"], peaks.get("quantized_compute_tflops")
    # a torch.profiler step's wall time was taken in the same run as its ops (ncu replays kernels),
    # and covers the whole step: not the total of a profile of some layers (--layers)
    wall = ({p: s.get("wall_s") for p, s in steps.items() if s.get("scopes") is None}
            if manifest.get("mode") == "torch" else None)
    ops = op_rows(samples, analytic, *rates, wall_s=wall)
    by_scope = {p: s["analytic_by_scope"] for p, s in steps.items() if "analytic_by_scope" in s}
    layers = layer_rows(samples, by_scope, {p: s.get("scopes") for p, s in steps.items()},
                        mixer_kinds(manifest.get("config", {})), *rates)
    kernels = kernel_rows(samples, peaks["mem_gbps"], top)
    return {"ops": [r.to_dict() for r in ops], "layers": [r.to_dict() for r in layers],
            "kernels": [r.to_dict() for r in kernels],
            "kernel_count": len(samples),        # in the profiled scope (--layers), not every launch
            "notes": [_overcount_note(phase, *times, manifest["device"])
                      for phase, times in overcounted(ops).items()]}


def _overcount_note(phase: str, named: float, wall: float, device: str) -> str:
    what = ("kernel durations, which overlap where kernels run at once" if device.startswith("cuda")
            else "self times of the aten ops")
    return (f"{phase}: its ops' times add up to {named * 1e3:.3f} ms, more than the step's wall time, "
            f"{wall * 1e3:.3f} ms (the host clock around the synchronised step); the ops' times are "
            f"torch.profiler's {what}, so the total is the wall time and nothing is unattributed")


def mixer_kinds(hf_config: dict) -> list[str]:
    """"sparse" or "lightning" per decoder layer, from the config.json the manifest holds."""
    from salactl.runtime.config import SPARSE

    return ["sparse" if m == SPARSE else "lightning" for m in hf_config.get("mixer_types", [])]


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
    """Profile into a staging directory and move its files into --out only when the whole session
    succeeded, so an interrupted or failed run leaves no partial profile, and no directory, behind."""
    from salactl.profiling.preflight import check_spec

    # a mode that cannot run, or NVML that cannot sample, fails before any file or directory exists,
    # and before the spec's size checks (exit 11), whose advice is moot for a profile that cannot run
    mode = resolve_mode(opts.mode, spec, opts.ncu_path, opts.ncu_given)
    sampler = None
    if opts.nvml:
        from salactl.profiling.nvml_sampler import NvmlSampler, nvml_index
        from salactl.runtime.loader import resolve_device

        sampler = NvmlSampler(index=nvml_index(resolve_device(spec.device)))    # the profiled GPU, not GPU 0
    check_spec(spec)
    return run_staged(spec, opts, mode, sampler)


def run_staged(spec: ProfileSpec, opts: SessionOptions, mode: str, sampler=None) -> dict:
    """run() once its mode is resolved. A failed ncu run keeps ncu's log, beside --out, and names it."""
    final = opts.out_dir
    # staged on --out's filesystem: inside --out where it exists (it may be a mount point or a link
    # to another filesystem, where a rename from beside it fails with EXDEV after all the work),
    # else in its nearest existing ancestor (the parents that do not exist yet are created only
    # when the files move in)
    where = final if final.is_dir() else _nearest_existing(final.parent)
    staging = None
    try:
        with interrupts_deferred():         # a Ctrl-C right after mkdtemp still finds it to remove
            staging = Path(tempfile.mkdtemp(prefix=f".{out_dirs.short_name(final)}.tmp-", dir=where))
        with _write_failures_name(final), out_of_memory_is_capacity("profile", _memory_fix(spec)):
            result = _run(spec, replace(opts, out_dir=staging), mode, sampler)
            result["out_dir"] = str(final)
            result["files"] = {k: str(final / Path(v).name) for k, v in result.get("files", {}).items()}
            result["files"]["result"] = str(final / "result.json")
            write_json(staging / "result.json", result)
            replace_profile(staging, final, opts.overwrite)
        return result
    except ProfilerFailedError as e:
        kept = _keep_log(staging / "ncu.log", final)
        if kept is None:
            raise
        raise ProfilerFailedError(f"{e}; ncu's output is in {kept}") from e
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _memory_fix(spec: ProfileSpec) -> str:
    return "lower --context, --batch or --chunk-size" if "prefill" in spec.phases else "lower --context or --batch"


def _keep_log(log: Path, final: Path) -> Path | None:
    """Move a failed run's ncu.log out of the staging directory that is about to be removed, to a new
    name beside --out (FINAL.ncu-XXXX.log, never an existing file's; --out's parent is created where
    it does not exist yet); None where there is no log or it cannot be moved."""
    if not log.is_file():
        return None
    final = Path(os.path.abspath(final))        # "." or "..": a parent that is not inside --out
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, kept = tempfile.mkstemp(prefix=f"{out_dirs.short_name(final)}.ncu-", suffix=".log", dir=final.parent)
    except OSError:
        return None
    os.close(fd)
    try:
        shutil.move(log, kept)      # a copy where the staging directory, in --out, is on another disk
    except OSError:
        Path(kept).unlink(missing_ok=True)
        return None
    return Path(kept)


@contextmanager
def _write_failures_name(final: Path) -> Iterator[None]:
    """A full disk while profiling is one OutputWriteError naming --out, not the staging file that
    the write went to."""
    try:
        yield
    except DiskFullError as e:
        raise _cannot_write_profile(final, e.reason, e.remedy) from e
    except OutputWriteError as e:
        raise _cannot_write_profile(final, str(e)) from e
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        raise _cannot_write_profile(final, e.strerror, write_remedy(e)) from e


def _cannot_write_profile(final: Path, cause: str, remedy: str | None = None) -> OutputWriteError:
    """remedy None: no errno tells why (torch's trace export), so space is the likely cause."""
    return OutputWriteError(f"cannot write the profile in {final}: {cause}; {remedy or free_space()}")


def _nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def replace_profile(staging: Path, final: Path, overwrite: bool = True) -> None:
    """Move the files of `staging` into `final`, and out of it every other OUTPUT_FILES name an
    earlier profile left there (an ncu profile's profile.csv beside a new torch one would be
    imported with the new manifest), all or nothing: when a move fails, `final` is put back.
    Under a lock in `final`, so two profiles ending at once never mix their files; without
    `overwrite`, a profile found there is refused (OutputExistsError), not replaced."""
    final.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(final / PROFILE_LOCK, remove=True):
        _replace_files(staging, final, overwrite)


def _replace_files(staging: Path, final: Path, overwrite: bool) -> None:
    if not overwrite:
        check_destinations([final / name for name in OUTPUT_FILES], overwrite=False)
    new = {f.name for f in staging.iterdir() if f.is_file()}
    stale = [final / name for name in OUTPUT_FILES if name not in new and (final / name).is_file()]
    aside = staging / "replaced"        # a subdirectory: move_all moves only the files of staging
    aside.mkdir()
    moved: list[Path] = []
    try:
        for path in stale:
            os.replace(path, aside / path.name)
            moved.append(path)
        move_all(staging, final, overwrite=True)
    except BaseException:
        for path in reversed(moved):
            os.replace(aside / path.name, path)
        raise


def _run(spec: ProfileSpec, opts: SessionOptions, mode: str, nvml_sampler=None) -> dict:
    t0 = time.perf_counter()
    out = opts.out_dir
    sampler = nvml_sampler if nvml_sampler is not None else nullcontext()
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
    if nvml_sampler is not None:
        result["nvml"] = nvml_sampler.summary()
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
    if not manifest_path.is_file():
        raise ProfilerFailedError("ncu wrote a report, but the profiled step never finished (it wrote no "
                                  "step.json)")
    source, exported_by = "ncu's CSV export", " ".join(export_command(ncu, Path(report.name)))
    try:
        manifest = read_ncu_manifest(manifest_path)
        kernels = parse_csv(csv_path, source, hint=f"it came from: {exported_by}")
        tables = ncu_tables(manifest, kernels, opts.top, source)
    except UsageError as e:         # ncu's own output: a profiler failure, not a bad option or file
        raise ProfilerFailedError(str(e)) from e
    # the mode tells --import this directory is an ncu profile
    write_json(manifest_path, {"mode": "ncu", **manifest})
    return tables | {"files": {"ncu_report": str(report), "csv": str(csv_path), "manifest": str(manifest_path)}}


def load_saved(out: Path, top: int = 20, ncu_path: str | None = None) -> dict:
    """Tables from a saved ncu profile directory: step.json and profile.csv, which ncu (ncu_path,
    else the one found) exports from profile.ncu-rep where only the report is there."""
    manifest_path, csv_path, report = out / "step.json", out / "profile.csv", out / "profile.ncu-rep"
    manifest = read_ncu_manifest(manifest_path)
    if csv_path.exists():
        if ncu_path:
            raise UsageError(f"--ncu-path applies only to exporting a profile.ncu-rep without a profile.csv, "
                             f"and {csv_path} exists: drop --ncu-path")
        kernels = parse_csv(csv_path)
    elif report.exists():
        text = export_text(_ncu_for_export(ncu_path, report), report)
        kernels = parse_csv_text(text, str(csv_path))     # kept only once it is a kernel table
        _keep_export(csv_path, text)
    else:
        raise UsageError(f"{csv_path} is missing; a saved profile directory holds step.json and profile.csv "
                         "or profile.ncu-rep (written by salactl profile --ncu)")
    return ncu_tables(manifest, kernels, top, str(csv_path))


def _keep_export(csv_path: Path, text: str) -> None:
    """Save ncu's export beside the report, so the next --import needs no ncu. The directory may be
    read-only or full (a saved profile on shared storage): the tables need no file, so that is a
    warning, not a failure."""
    try:
        write_atomic(csv_path, text)
    except (OSError, DiskFullError) as e:
        reason = e.reason if isinstance(e, DiskFullError) else e.strerror or str(e)
        output.stderr.print(f"warning: cannot save ncu's export as {csv_path} ({reason}); the tables are "
                            "read from it unsaved, and the next --import exports it again")


def ncu_tables(manifest: dict, kernels, top: int, source: str) -> dict:
    """The result record of an ncu profile; refused when no kernel ran inside a profiled phase's NVTX
    range (a capture without --nvtx or without salactl's ranges), whose tables would be all zeros."""
    samples = from_ncu(kernels)
    steps = manifest["steps"]
    if not any(s.phase in steps for s in samples):
        raise UsageError(f"none of the {len(samples)} kernels in {source} ran inside salactl's NVTX range "
                         f"{' or '.join(map(repr, steps))}; capture with salactl profile --ncu (ncu --nvtx, with "
                         "salactl's ranges open)")
    peaks = manifest_peaks(manifest, manifest["device"].split(":")[0])
    manifest, notes = _profiled_phases(manifest, samples, source)
    t = tables(samples, manifest, peaks, top)
    return {"mode": "ncu", "manifest": manifest, "peaks": peaks, **t, "notes": notes + t["notes"]}


def _profiled_phases(manifest: dict, samples, source: str) -> tuple[dict, list[str]]:
    """The manifest less the phases none of whose kernels falls in the scopes it profiled (tabled,
    they would be all zeros), and a note (also a warning) for each; none left is a usage error."""
    steps = manifest["steps"]
    held = {p for p, st in steps.items() for s in samples if s.phase == p and in_scopes(s, st.get("scopes"))}
    if not held:
        scopes = "; ".join(f"{p}: {', '.join(st.get('scopes') or ['all'])}" for p, st in steps.items())
        raise UsageError(f"none of the kernels in {source} falls in the scopes step.json profiles ({scopes}); "
                         "import the directory salactl profile --ncu wrote, with its own step.json")
    notes = []
    for phase in (p for p in steps if p not in held):
        notes.append(f"{phase}: left out, as {source} holds no kernel of its profiled scopes (ncu's "
                     "--launch-count may have stopped before it, or step.json is not this profile's)")
        output.stderr.print(f"warning: {notes[-1]}")
    return {**manifest, "steps": {p: st for p, st in steps.items() if p in held}}, notes


def _ncu_for_export(ncu_path: str | None, report: Path) -> str:
    try:
        return find_ncu(ncu_path)
    except ToolMissingError:
        named = os.environ.get("SALACTL_NCU")
        # "--ncu-path X (SALACTL_NCU=X) is not an executable file" says it already, unless X names
        # nothing and no ncu is installed either: then how to export it elsewhere says more
        if ncu_path or (named and (Path(named).exists() or installed_ncu())):
            raise
        raise ToolMissingError(
            f"{report} has no profile.csv beside it, and exporting one needs Nsight Compute (ncu), which "
            "was not found; put ncu on PATH or pass --ncu-path, or export it where ncu is installed: "
            f"{' '.join(export_command('ncu', Path(report.name)))} > profile.csv") from None


def _run_torch(spec: ProfileSpec, opts: SessionOptions) -> dict:
    from salactl.profiling.step_runner import describe
    from salactl.profiling.torch_mode import profile_torch
    from salactl.profiling.workload import build

    output.stderr.print(f"profiling {', '.join(spec.phases)} of {spec.model} with torch.profiler ...")
    w = build(spec)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    trace = opts.out_dir / "trace.json"
    samples, seconds = profile_torch(w, trace)
    manifest = {"mode": "torch", **describe(w, seconds)}     # --import refuses it: no counters to re-render
    write_json(opts.out_dir / "step.json", manifest)
    peaks = manifest_peaks(manifest, w.device.type)
    return {"manifest": manifest, "peaks": peaks,
            "files": {"chrome_trace": str(trace), "manifest": str(opts.out_dir / "step.json")},
            **tables(samples, manifest, peaks, opts.top)}
