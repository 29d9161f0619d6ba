"""`salactl profile --import` of the real H200 capture (tests/fixtures/ncu) where some kernels have
n/a DRAM counters: the op and layer rows holding them have unknown bytes, and so unknown GB/s and
% peak, never ones computed from the analytic (predicted) bytes under the measured-bytes header."""

import csv
import io
import json

import pytest

from conftest import run_cli
from test_profile_import import ncu_profile_dir


@pytest.fixture(autouse=True)
def datasheet_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path / "cache"))


def test_rows_with_unknown_bytes_have_no_bandwidth(tmp_path, capsys):
    saved = ncu_profile_dir(tmp_path / "p")
    table = list(csv.reader(io.StringIO((saved / "profile.csv").read_text())))
    read = table[0].index("dram__bytes_read.sum")
    for r in table[2:]:
        if '"<default domain>:lm_head:' in r[4]:
            r[read] = "n/a"
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(table)
    (saved / "profile.csv").write_text(buf.getvalue())
    code, out, err = run_cli(["profile", "--import", saved, "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    unknown = [r for r in d["ops"] + d["layers"] if r["dram_bytes"] is None]
    assert {r.get("op", r.get("scope")) for r in unknown} == {"lm_head", "total"}
    for r in unknown:
        assert r["time_s"] > 0 and r["pct_of_peak"] is None, r
        assert r.get("achieved_gbps") is None and r.get("pct_of_peak_bw") is None, r
    known = [r for r in d["ops"] if r["dram_bytes"] is not None and r["time_s"]]
    assert all(r["achieved_gbps"] == pytest.approx(r["dram_bytes"] / r["time_s"] / 1e9) for r in known)
    total = next(r for r in d["ops"] if r["op"] == "total")
    assert total["achieved_tflops"] > 0        # the compute rate needs no bytes
