"""Where a failed ncu run keeps ncu's log, and what a profile that hits a file-size limit says.

The log goes beside --out whatever --out is: an existing directory (the profile is staged inside
it), one whose parents do not exist yet, a mount point of another file system, a name of NAME_MAX
bytes. A profile write past `ulimit -f` (EFBIG) names the limit, not a full disk. ncu is the shell
script stand-in of test_ncu_failures; everything of salactl's runs for real."""

import gzip
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.errors import OutputWriteError, ProfilerFailedError

from test_ncu_failures import FIXTURE, RUN_THE_STEP, fake_ncu, posix_only, session

FAILING = "echo '==ERROR== Unknown Error on device 0.'; exit 1"


def kept_log(tmp_path: Path, out: Path) -> Path:
    """The log a failed ncu run into `out` names, after checking it holds ncu's output."""
    with pytest.raises(ProfilerFailedError) as e:
        session(tmp_path, fake_ncu(tmp_path / "ncu", FAILING), out)
    message, _, log = str(e.value).partition("; ncu's output is in ")
    assert message == "ncu exited with code 1: ==ERROR== Unknown Error on device 0." and log, e.value
    log = Path(log)
    assert log.read_text().splitlines()[1:] == ["==ERROR== Unknown Error on device 0."]
    return log


@posix_only
def test_the_log_of_a_run_into_an_existing_out_goes_beside_it_not_into_it(tmp_path):
    out = tmp_path / "runs" / "p"
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    log = kept_log(tmp_path, out)
    assert log.parent == out.parent and log.name.startswith("p.ncu-") and log.suffix == ".log"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]          # no log, no staging directory


@posix_only
def test_the_log_goes_beside_an_out_whose_parents_do_not_exist_yet(tmp_path):
    out = tmp_path / "runs" / "new" / "p"
    log = kept_log(tmp_path, out)
    assert log.parent == out.parent and log.name.startswith("p.ncu-")
    assert sorted(p.name for p in out.parent.iterdir()) == [log.name]      # and no profile


@posix_only
def test_the_log_goes_beside_an_out_that_is_a_mount_point_of_another_file_system(tmp_path, tmpfs):
    """The staging directory is inside --out, on the mounted file system: the log is copied out."""
    out = tmpfs("4m")
    log = kept_log(tmp_path, out)
    assert log.parent == tmp_path and log.name.startswith(f"{out.name}.ncu-")
    assert os.listdir(out) == []


@posix_only
def test_the_log_of_an_out_named_with_name_max_bytes_gets_a_short_name(tmp_path):
    out = tmp_path / ("p" * 255)
    log = kept_log(tmp_path, out)
    assert log.parent == tmp_path and len(log.name) < 100


CHILD = """\
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from salactl.errors import SalactlError
from test_ncu_failures import session
try:
    session(None, sys.argv[2], Path(sys.argv[3]))
except SalactlError as e:
    print(type(e).__name__, e.exit_code, e)
"""


@posix_only
def test_a_profile_write_past_the_file_size_limit_names_the_limit_not_a_full_disk(tmp_path):
    """profile.csv (840 KB) is written past a 256 KB `ulimit -f`, after the profiled step wrote its
    step.json (about 11 KB) under the same limit."""
    resource = pytest.importorskip("resource")
    csv = tmp_path / "export.csv"
    csv.write_bytes(gzip.decompress((FIXTURE / "profile.csv.gz").read_bytes()))
    ncu = fake_ncu(tmp_path / "ncu", RUN_THE_STEP, export=f"cat '{csv}'")
    out = tmp_path / "runs" / "p"
    out.parent.mkdir()

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)        # EFBIG from write(), not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    r = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent), ncu, str(out)], capture_output=True,
                       text=True, timeout=300, preexec_fn=limit_file_size)
    assert r.stdout.strip() == (f"OutputWriteError {OutputWriteError.exit_code} cannot write the profile in {out}: "
                                "File too large; the file reached a size limit of its file system or of this "
                                "process (ulimit -f); choose another --out"), r.stderr
    assert os.listdir(out.parent) == []                     # no profile and no staging directory
