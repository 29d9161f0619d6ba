"""`report latency` on a file whose first line is not JSON under an address-space cap (`ulimit -v`):
the one-line input error (exit 7), never a MemoryError from reading far more of the file than the
message needs. Run for real in a subprocess whose limit is set once the modules are loaded."""

import json
import subprocess
import sys

import pytest

from salactl.errors import DatasetError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

HEADROOM = 48 * 2**20       # address space left after the imports: well under the records line cap (64 MiB)

LIMITED = """
import resource, sys
import salactl.cli, salactl.cmd_report, salactl.reports.records, salactl.reports.latency
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + %d, resource.RLIM_INFINITY))
sys.argv = ["salactl", *sys.argv[1:]]
salactl.cli.main()
""" % HEADROOM


def _report_limited(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LIMITED, "report", "latency", str(path), "--format", "csv"],
                          capture_output=True, text=True, timeout=120,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def _one_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == DatasetError.exit_code and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    (line,) = r.stderr.strip().splitlines()
    return line


def test_a_first_line_not_json_is_a_one_line_error_under_an_address_space_cap(tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_text("# my runs\n" + json.dumps({"schema_version": 1}) + "\n")
    line = _one_line(_report_limited(path))
    assert line.startswith(f"error: {path}:1 is not valid JSON (") and line.endswith("each line must be one "
                                                                                  "record object")


def test_a_json_document_is_still_named_as_one_under_an_address_space_cap(tmp_path):
    doc = tmp_path / "run1.json"
    doc.write_text("\ufeff" + json.dumps({"schema_version": 1, "kind": "run", "rows": list(range(50))}, indent=2))
    assert _one_line(_report_limited(doc)) == (
        f"error: {doc} is a JSON document, not JSON lines (one record object per line); give the "
        "records.jsonl that bench, sweep or run --out DIR append to")
