"""How an Nsight Compute run fails: the error quotes ncu's message (never the command line that
ncu.log starts with) and names a log that still exists, an export without a kernel table is a
profiler failure (exit 14), output that is not UTF-8 is read anyway, an ncu named by SALACTL_NCU
that cannot run is the missing tool's error (exit 12), and Ctrl-C or SIGTERM stops the process that
ncu profiles too.

ncu is an external tool, so a small shell script stands in for it here; everything of salactl's
runs for real, the profiled step included (sala-nano on the CPU: the session is entered past its
CUDA check, which is the only part of an ncu profile that needs a GPU)."""

import gzip
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from salactl.errors import ProfilerFailedError, ToolMissingError
from salactl.profiling.ncu_runner import NcuOptions, export_csv, find_ncu, run_ncu
from salactl.profiling.session import SessionOptions, run_staged
from salactl.profiling.spec import ProfileSpec

from conftest import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "ncu"
posix_only = pytest.mark.skipif(os.name != "posix", reason="the stand-in ncu is a shell script")


def fake_ncu(path: Path, profile: str, export: str = "exit 0") -> str:
    """A stand-in ncu: `export` runs for `ncu --import ...`, `profile` for the profiling call, with
    "$@" the process ncu would profile and $BASE the report's base name."""
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = --import ]; then
        {export}
            exit
        fi
        while [ "$1" != -o ]; do shift; done
        BASE="$2"; shift 2
        {profile}
        """))
    path.chmod(0o755)
    return str(path)


RUN_THE_STEP = 'echo "==PROF== Connected to process $$"; "$@" || exit $?; echo rep > "$BASE.ncu-rep"'


def ncu_args(tmp_path: Path, ncu: str) -> tuple:
    out = tmp_path / "staging"
    out.mkdir()
    return ncu, out, ["decode/"], out / "spec.json", out / "step.json", NcuOptions(), out / "ncu.log"


@posix_only
def test_the_error_is_ncus_last_error_line_not_the_command_line(tmp_path):
    ncu = fake_ncu(tmp_path / "ncu", "echo '==PROF== Connected'; echo '==ERROR== Failed to prepare kernel'; "
                                     "echo '==ERROR== An error was reported by the driver'; exit 1")
    with pytest.raises(ProfilerFailedError) as e:
        run_ncu(*ncu_args(tmp_path, ncu))
    assert str(e.value) == "ncu exited with code 1: ==ERROR== An error was reported by the driver"
    assert (tmp_path / "staging" / "ncu.log").read_text().startswith(f"{ncu} --target-processes all")


@posix_only
def test_the_profiled_processs_error_beats_ncus_line_about_its_exit_code(tmp_path):
    ncu = fake_ncu(tmp_path / "ncu", "echo 'error: --layers 99 is out of range'; "
                                     "echo '==ERROR== The application returned an error code (2).'; exit 2")
    with pytest.raises(ProfilerFailedError, match=r"^ncu exited with code 2: error: --layers 99 is out of range$"):
        run_ncu(*ncu_args(tmp_path, ncu))


@posix_only
def test_exit_0_without_a_report_says_so(tmp_path):
    ncu = fake_ncu(tmp_path / "ncu", "echo '==PROF== Disconnected'; exit 0")
    with pytest.raises(ProfilerFailedError, match=r"^ncu exited with code 0 but wrote no report$"):
        run_ncu(*ncu_args(tmp_path, ncu))


@posix_only
def test_output_that_is_not_utf8_is_read_with_replacement(tmp_path):
    ncu = fake_ncu(tmp_path / "ncu", r"printf '==ERROR== bad \377\376 bytes\n'; exit 3",
                   export=r"printf '\377\376 not utf-8\n'; exit 0")
    with pytest.raises(ProfilerFailedError, match="^ncu exited with code 3: ==ERROR== bad \ufffd\ufffd bytes$"):
        run_ncu(*ncu_args(tmp_path, ncu))
    export_csv(ncu, tmp_path / "r.ncu-rep", tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text() == "\ufffd\ufffd not utf-8\n"


SPEC = ProfileSpec(model="sala-nano", random_weights=True, phases=("decode",), context=16, device="cpu",
                   warmup=0)


def session(tmp_path: Path, ncu: str, out: Path) -> dict:
    """An ncu profile session into `out` with `ncu`, past the CUDA check (the step runs on the CPU)."""
    return run_staged(SPEC.with_checkpoint_weights(), SessionOptions(mode="ncu", out_dir=out, ncu_path=ncu),
                      "ncu")


@posix_only
def test_a_failed_run_keeps_ncus_log_beside_out_and_names_it(tmp_path):
    ncu = fake_ncu(tmp_path / "ncu", "echo '==ERROR== Unknown Error on device 0.'; exit 1")
    out = tmp_path / "runs" / "p"
    (tmp_path / "runs").mkdir()
    with pytest.raises(ProfilerFailedError) as e:
        session(tmp_path, ncu, out)
    message, log = str(e.value).split("; ncu's output is in ")
    assert message == "ncu exited with code 1: ==ERROR== Unknown Error on device 0."
    log = Path(log)
    assert log.parent == tmp_path / "runs" and log.name.startswith("p.ncu-") and log.suffix == ".log"
    assert log.read_text().splitlines()[1:] == ["==ERROR== Unknown Error on device 0."]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [log.name]      # no profile, no staging


@posix_only
@pytest.mark.parametrize("export,what", [
    ("exit 0", "ncu's CSV export has no kernel table (no header row starting with \"ID\"); it came from: "),
    ("echo '\"ID\",\"Kernel Name\"'; echo '\"\",\"\"'", "ncu's CSV export lacks columns"),
])
def test_an_export_without_a_kernel_table_is_a_profiler_failure(export, what, tmp_path):
    csv = tmp_path / "export.csv"
    csv.write_bytes(gzip.decompress((FIXTURE / "profile.csv.gz").read_bytes()))
    out = tmp_path / "p"
    ok = session(tmp_path, fake_ncu(tmp_path / "ncu", RUN_THE_STEP, export=f"cat '{csv}'"), out)
    assert ok["kernel_count"] == 420 and (out / "profile.csv").read_bytes() == csv.read_bytes()
    with pytest.raises(ProfilerFailedError) as e:
        session(tmp_path, fake_ncu(tmp_path / "ncu", RUN_THE_STEP, export=export), tmp_path / "q")
    assert e.value.exit_code == 14 and str(e.value).startswith(what), e.value
    assert "/.q.tmp" not in str(e.value)           # names no file of the staging directory, which is gone
    assert Path(str(e.value).split("; ncu's output is in ")[1]).is_file()
    assert not (tmp_path / "q").exists()


@posix_only
def test_a_salactl_ncu_that_cannot_run_is_the_missing_tools_error(tmp_path, monkeypatch, capsys):
    """Not passed over for the ncu on PATH, and not a PermissionError when it is not executable:
    exit 12 naming SALACTL_NCU, here through --import, which exports a saved report with it."""
    on_path = tmp_path / "bin"
    on_path.mkdir()
    fake_ncu(on_path / "ncu", "exit 0")
    monkeypatch.setenv("PATH", f"{on_path}{os.pathsep}{os.environ['PATH']}")
    not_executable = tmp_path / "ncu-copy"
    not_executable.write_text("#!/bin/sh\n")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "step.json").write_bytes((FIXTURE / "step.json").read_bytes())
    (saved / "profile.ncu-rep").write_bytes(b"a report")
    for named in (not_executable, tmp_path / "nonexistent" / "ncu"):
        monkeypatch.setenv("SALACTL_NCU", str(named))
        with pytest.raises(ToolMissingError, match=f"^SALACTL_NCU={named} is not an executable file"):
            find_ncu()
        code, out, err = run_cli(["profile", "--import", saved], capsys)
        assert code == ToolMissingError.exit_code == 12, err
        assert err.strip() == f"error: SALACTL_NCU={named} is not an executable file; point it at ncu, or unset it"
    assert sorted(p.name for p in saved.iterdir()) == ["profile.ncu-rep", "step.json"]


STOPPED_RUN = """\
import signal, sys
from pathlib import Path
from salactl.profiling.ncu_runner import NcuOptions, run_ncu
signal.signal(signal.SIGTERM, signal.default_int_handler)    # as salactl's own handler: an interrupt
out = Path(sys.argv[2])
try:
    run_ncu(sys.argv[1], out, ["decode/"], out / "spec.json", out / "step.json", NcuOptions(), out / "ncu.log")
except KeyboardInterrupt:
    print("interrupted")
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_stops_the_process_ncu_profiles(sig, tmp_path):
    """ncu's profiled process lives on in ncu's process group; it ignores SIGINT and SIGTERM here,
    so only the SIGKILL that ends the escalation stops it."""
    pidfile = tmp_path / "child.pid"
    ncu = fake_ncu(tmp_path / "ncu", f"sh -c 'trap \"\" INT TERM; echo $$ > {pidfile}; exec sleep 600' & wait")
    out = tmp_path / "staging"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_RUN, ncu, str(out)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None, "the stand-in ncu never started"
            time.sleep(0.05)
        child = int(pidfile.read_text())
        proc.send_signal(sig)
        stdout, _ = proc.communicate(timeout=60)
        assert stdout == "interrupted\n"
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the profiled process outlived the interrupted run"
    finally:
        proc.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
