"""Run the profiled step under Nsight Compute and export its raw page as CSV.

Hand-written command assembly: ncu has no Python launcher API; its report reader (`ncu_report`)
ships only inside the ncu install, so we read the CSV export, which every ncu version writes."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time
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
    """--ncu-path, else SALACTL_NCU, else ncu on PATH or in the usual install places. An ncu named
    (--ncu-path, SALACTL_NCU) that is not an executable file is the error, never passed over."""
    if explicit:
        if _executable(explicit):
            return explicit
        raise ToolMissingError(f"--ncu-path {explicit} is not an executable file")
    named = os.environ.get("SALACTL_NCU")
    if named:
        if _executable(named):
            return named
        raise ToolMissingError(f"SALACTL_NCU={named} is not an executable file; point it at ncu, or unset it")
    found = installed_ncu()
    if found:
        return found
    raise ToolMissingError("Nsight Compute (ncu) not found on PATH; it usually lives in "
                           "/usr/local/cuda/bin or /opt/nvidia/nsight-compute/<version>/ — add it "
                           "to PATH, pass --ncu-path, or use --torch")


def installed_ncu() -> str | None:
    """ncu on PATH, else the newest in the usual install places, else None."""
    on_path = shutil.which("ncu")
    if on_path:
        return on_path
    found = sorted(p for g in SEARCH_GLOBS for p in glob.glob(g) if _executable(p))
    return found[-1] if found else None


def _executable(path: str) -> bool:
    return Path(path).is_file() and os.access(path, os.X_OK)


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


# ncu's line for any profiled process that exits non-zero: the process's own last line says more
APP_EXIT = "The application returned an error code"


def classify_failure(output: str, returncode: int) -> SalactlError:
    """The error for a failed ncu run from its output (without the command line): the profiled
    process's own `error: ` line, else ncu's last ==ERROR== line, else the last line of the process."""
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
    errors = [ln for ln in lines if ln.startswith("==ERROR==")]
    app = [ln for ln in lines if not ln.startswith("==")]             # not ncu's own ==PROF== lines
    tiers = (own, [ln for ln in errors if APP_EXIT not in ln], app, errors, lines, ["no output"])
    tail = next(t for t in tiers if t)[-1]
    return ProfilerFailedError(f"ncu exited with code {returncode}: {tail[:300]}")


def report_file(base: Path) -> Path:
    """The file `ncu -o base` writes: base + ".ncu-rep" (appended, not a replaced suffix)."""
    return base.with_name(base.name + ".ncu-rep")


def run_ncu(ncu: str, out_dir: Path, includes: list[str], spec_path: Path, manifest_path: Path,
            opts: NcuOptions, log_path: Path) -> tuple[Path, Path]:
    """Profile; returns (.ncu-rep, raw CSV). The report is written under a temp name and renamed
    only when ncu succeeded, so a failed run leaves no report that looks complete. log_path gets the
    command line, then ncu's and the profiled process's output."""
    report = out_dir / "profile.ncu-rep"
    child = [sys.executable, "-m", "salactl.profiling.step_runner", str(spec_path), str(manifest_path)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with atomic_path(report) as tmp_rep:
        tmp_base = tmp_rep.with_suffix("")     # ncu appends ".ncu-rep" to it: report_file(tmp_base) == tmp_rep
        cmd = profile_command(ncu, tmp_base, includes, child, opts)
        command_line = " ".join(cmd) + "\n"
        with open(log_path, "w") as log:
            log.write(command_line)
            log.flush()
            returncode = run_in_own_group(cmd, log, env)
        output = Path(log_path).read_bytes().decode(errors="replace").removeprefix(command_line)
        if returncode != 0 or "ERR_NVGPUCTRPERM" in output:
            raise classify_failure(output, returncode)
        if not tmp_rep.exists():
            if "No kernels were profiled" in output:
                raise ProfilerFailedError("ncu profiled no kernels: the NVTX ranges were not seen (is the run on "
                                          "a GPU?)")
            raise ProfilerFailedError("ncu exited with code 0 but wrote no report")
    csv_path = out_dir / "profile.csv"
    export_csv(ncu, report, csv_path)
    return report, csv_path


# after Ctrl-C or SIGTERM: how long ncu and the process it profiles get to end after SIGINT, then
# after SIGTERM, before SIGKILL (on Windows: after CTRL_BREAK_EVENT, both together, before the kill)
STOP_GRACE_S = (3.0, 2.0)
# subprocess has the name only on Windows; 0x200 is its documented value
CREATE_NEW_PROCESS_GROUP = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0x200)


def group_popen_kwargs(os_name: str = os.name) -> dict:
    """Popen arguments that start ncu at the head of a process group of its own. On Windows that is
    a console process group, which Ctrl-C does not reach: only our CTRL_BREAK_EVENT stops it."""
    if os_name == "nt":
        return {"creationflags": CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def stop_signals(os_name: str = os.name) -> list[tuple[str, float]]:
    """The signals (by name: each exists on its platform only) that ask ncu's group to end, each
    with its grace period; what is left after them is killed: SIGKILL to the group on POSIX,
    proc.kill() (TerminateProcess, ncu itself) on Windows."""
    if os_name == "nt":
        return [("CTRL_BREAK_EVENT", sum(STOP_GRACE_S))]
    return list(zip(("SIGINT", "SIGTERM"), STOP_GRACE_S))


def run_in_own_group(cmd: list[str], log, env: dict) -> int:
    """Run cmd, its output to `log`, in a process group of its own; its exit status. Interrupted
    (KeyboardInterrupt, which SIGTERM raises too), the whole group is stopped, the profiled
    process ncu started included, before the interrupt goes on."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, **group_popen_kwargs())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop_group(proc)
        raise


def stop_group(proc: subprocess.Popen) -> None:
    """The stop_signals in turn, each with its grace period, then the kill of whatever is left;
    a second interrupt meanwhile skips to the kill."""
    windows = os.name == "nt"
    try:
        for name, grace in stop_signals():
            sig = getattr(signal, name)
            if windows:
                if not _signal_console_group(proc, sig) or _ended(proc, grace):
                    break
            elif not _signal_group(proc.pid, sig) or _group_ended(proc, grace):
                break
    finally:
        if windows:
            proc.kill()
        else:
            _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _signal_console_group(proc: subprocess.Popen, sig: int) -> bool:
    """Windows: `sig` to the console process group proc leads; whether it could be sent."""
    if proc.poll() is not None:
        return False
    try:
        proc.send_signal(sig)
        return True
    except OSError:             # no console to send it through: nothing but the kill is left
        return False


def _ended(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _signal_group(pgid: int, sig: int) -> bool:
    """Whether the group still had a process to signal."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:         # a member that changed its user: the others were signalled
        return True


def _group_ended(proc: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        proc.poll()                 # reaps ncu once it exits, so that a zombie does not keep the group
        if not _signal_group(proc.pid, 0):
            return True
        time.sleep(0.05)
    return False


def export_csv(ncu: str, report: Path, csv_path: Path) -> None:
    """`ncu --import R --csv --page raw --print-units base` into csv_path (temp + rename)."""
    write_atomic(csv_path, export_text(ncu, report))


def export_text(ncu: str, report: Path) -> str:
    """The raw-page CSV ncu exports from `report`; bytes that are not UTF-8 (a kernel name, a
    message in another locale) are replaced, not fatal."""
    exported = subprocess.run(export_command(ncu, report), capture_output=True)
    stdout, stderr = (b.decode(errors="replace") for b in (exported.stdout, exported.stderr))
    if exported.returncode != 0:
        raise classify_failure(stdout + stderr, exported.returncode)
    return stdout
