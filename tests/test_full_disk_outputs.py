"""Outputs written whole through a temp name (report files, the peaks cache) on a disk that fills up
(RLIMIT_FSIZE, as `ulimit -f`: a write past it fails with EFBIG): one line naming the output, exit
16, and neither the output nor a temp file left."""

import json
import os

from salactl.errors import OutputWriteError

from test_atomic_writes import python_with_file_limit
from test_output_write_failures import error_line, salactl_with_file_limit

RECORD = {"schema_version": 1, "kind": "bench", "run_id": "a-S1", "label": "a", "profile": "soar", "phase": "S1",
          "target": "embedded", "model": "sala-nano", "completed": 12, "failed": 0, "mean_ttft_ms": 10.0}


def test_a_full_disk_while_writing_a_latency_report_leaves_no_report_file(tmp_path):
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps(RECORD) + "\n")
    out = tmp_path / "R"
    # report.md and report.csv (~0.5 KB) fit, report.html (~1 KB) does not
    r = salactl_with_file_limit(600, "report", "latency", records, "--out", out, "--format", "md,csv,html",
                                "--no-plots")
    assert r.returncode == OutputWriteError.exit_code, r.stderr
    assert error_line(r.stderr) == (f"error: cannot write {out / 'report.html'}: File too large; the file "
                                    "reached a size limit of its file system or of this process (ulimit -f); "
                                    "choose another --out")
    assert not out.exists()                         # nor a temp file, nor the directory the write made


def test_a_full_disk_while_storing_a_measurement_names_the_peaks_cache(tmp_path):
    code = f"""
import os
os.environ["SALACTL_CACHE_DIR"] = {str(tmp_path)!r}
from salactl.errors import OutputWriteError
from salactl.runtime.peaks_measure import store_measurement
try:
    store_measurement("cpu:test", {{"mem_gbps": 10.0, "bf16_tflops": 1.0, "note": "x" * 8192}})
except OutputWriteError as e:
    print(e.exit_code, e)
"""
    r = python_with_file_limit(4096, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"16 cannot write the peaks cache {tmp_path / 'peaks.json'}: File too large; the "
                                "file reached a size limit of its file system or of this process (ulimit -f); "
                                "set SALACTL_CACHE_DIR to a directory on another disk")
    assert os.listdir(tmp_path) == []              # no temp, and the lock file is gone
