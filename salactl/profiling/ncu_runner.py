"""Run the profiled step under Nsight Compute and export its raw page as CSV.

Hand-written command assembly: ncu has no Python launcher API; its report reader (`ncu_report`)
ships only inside the ncu install, so we read the CSV export, which every ncu version writes."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from salactl.errors import (ProfilerFailedError, ProfilerPermissionError, SalactlError,
                            ToolMissingError, UsageError)
from salactl.reports.atomic import atomic_path, write_atomic

# "bytes": time, DRAM traffic and DRAM % of peak. "sol" adds the SM and memory-subsystem
# speed-of-light %, which are maxima over many sub-metrics: on an H200 (ncu 2025.3.1) that set took
# 10 replay passes per kernel, ~0.45 s each kernel, too slow for a whole eager 9B step.
METRIC_SETS = {
    "bytes": ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
              "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "sol": ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
}
SEARCH_GLOBS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
                "/usr/local/cuda-*/bin/ncu")


def find_ncu(explicit: str | None = None) -> str:
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise ToolMissingError(f"--ncu-path {explicit} is not an executable file")
    for cand in (os.environ.get("SALACTL_NCU"), shutil.which("ncu")):
        if cand and Path(cand).is_file():
            return cand
    found = sorted(p for g in SEARCH_GLOBS for p in glob.glob(g) if os.access(p, os.X_OK))
    if found:
        return found[-1]
    raise ToolMissingError("Nsight Compute (ncu) not found on PATH; it usually lives in "
                           "/usr/local/cuda/bin or /opt/nvidia/nsight-compute/<version>/ — add it "
                           "to PATH, pass --ncu-path, or use --torch")


@dataclass(frozen=True)
class NcuOptions:
    launch_skip: int = 0
    launch_count: int | None = None
    metric_set: str = "bytes"

    def __post_init__(self) -> None:
        if self.metric_set not in METRIC_SETS:
            raise UsageError(f"unknown --ncu-metrics {self.metric_set!r}; valid: {', '.join(METRIC_SETS)}")


def nvtx_includes(phases, scopes) -> list[str]:
    """ncu --nvtx-include expressions: push/pop ranges nested as phase/scope, trailing '/'."""
    if scopes is None:
        return [f"{p}/" for p in phases]
    return [f"{p}/{s}/" for p in phases for s in scopes]


def profile_command(ncu: str, report_base: Path, includes: list[str], child_argv: list[str],
                    opts: NcuOptions) -> list[str]:
    cmd = [ncu, "--target-processes", "all", "--nvtx"]
    for inc in includes:
        cmd += ["--nvtx-include", inc]
    # caches flushed before each replay: the DRAM bytes are cold-cache
    cmd += ["--clock-control", "none", "--cache-control", "all",
            "--metrics", ",".join(METRIC_SETS[opts.metric_set]),
            "--launch-skip", str(opts.launch_skip)]
    if opts.launch_count:
        cmd += ["--launch-count", str(opts.launch_count)]
    cmd += ["-f", "-o", str(report_base), *child_argv]
    return cmd


def export_command(ncu: str, report: Path) -> list[str]:
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


def classify_failure(output: str, returncode: int) -> SalactlError:
    text = output
    if "ERR_NVGPUCTRPERM" in text:
        return ProfilerPermissionError(
            "ncu may not read GPU performance counters here (ERR_NVGPUCTRPERM); run as root or set "
            "the driver option NVreg_RestrictProfilingToAdminUsers=0, or use --torch")
    if "LibraryNotLoaded" in text or "Failed to initialize the profiler" in text:
        return ProfilerPermissionError(
            "ncu could not initialise the profiler on this machine (no counter access, e.g. under "
            "gVisor); use --torch")
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    own = [ln for ln in lines if ln.startswith("error: ")]            # the profiled process's error
    app = [ln for ln in lines if not ln.startswith("==")]             # not ncu's own ==PROF== lines
    tail = (own or app or lines or ["no output"])[-1]
    return ProfilerFailedError(f"ncu exited with code {returncode}: {tail[:300]}")


def report_file(base: Path) -> Path:
    """The file `ncu -o base` writes: base + ".ncu-rep" (appended, not a replaced suffix)."""
    return base.with_name(base.name + ".ncu-rep")


def run_ncu(ncu: str, out_dir: Path, includes: list[str], spec_path: Path, manifest_path: Path,
            opts: NcuOptions, log_path: Path) -> tuple[Path, Path]:
    """Profile; returns (.ncu-rep, raw CSV). The report is written under a temp name and renamed
    only when ncu succeeded, so a failed run leaves no report that looks complete."""
    report = out_dir / "profile.ncu-rep"
    child = [sys.executable, "-m", "salactl.profiling.step_runner", str(spec_path), str(manifest_path)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with atomic_path(report) as tmp_rep:
        tmp_base = tmp_rep.with_suffix("")     # ncu appends ".ncu-rep" to it: report_file(tmp_base) == tmp_rep
        cmd = profile_command(ncu, tmp_base, includes, child, opts)
        with open(log_path, "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        output = Path(log_path).read_text()
        if proc.returncode != 0 or "ERR_NVGPUCTRPERM" in output:
            raise classify_failure(output, proc.returncode)
        if not tmp_rep.exists():
            if "No kernels were profiled" in output:
                raise ProfilerFailedError("ncu profiled no kernels: the NVTX ranges were not seen (is the run on "
                                f"a GPU?); see {log_path}")
            raise classify_failure(output, proc.returncode)
    csv_path = out_dir / "profile.csv"
    export_csv(ncu, report, csv_path)
    return report, csv_path


def export_csv(ncu: str, report: Path, csv_path: Path) -> None:
    """`ncu --import R --csv --page raw --print-units base` into csv_path (temp + rename)."""
    exported = subprocess.run(export_command(ncu, report), capture_output=True, text=True)
    if exported.returncode != 0:
        raise classify_failure(exported.stdout + exported.stderr, exported.returncode)
    write_atomic(csv_path, exported.stdout)
