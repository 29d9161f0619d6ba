"""`salactl profile --import DIR` on damaged or foreign variants of the real H200 capture
(tests/fixtures/ncu): blank rows and doubled carriage returns are read, n/a counters stay unknown
with a warning, and a file cut short, not UTF-8, gzip-compressed, without units row or without
salactl's NVTX ranges is a one-line usage error (exit 2, as every bad file of --import), never a
traceback or a table of zeros."""

import csv
import gzip
import io
import json
import shutil
from pathlib import Path

import pytest

from salactl.errors import UsageError

from conftest import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "ncu"
CSV_TEXT = gzip.decompress((FIXTURE / "profile.csv.gz").read_bytes()).decode()


@pytest.fixture(autouse=True)
def datasheet_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path / "cache"))


def saved(tmp_path: Path, data: bytes | str, manifest: dict | None = None) -> Path:
    out = tmp_path / "p"
    out.mkdir()
    (out / "profile.csv").write_bytes(data.encode() if isinstance(data, str) else data)
    if manifest is None:
        shutil.copy(FIXTURE / "step.json", out / "step.json")
    else:
        (out / "step.json").write_text(json.dumps(manifest))
    return out


def rows() -> list[list[str]]:
    return list(csv.reader(io.StringIO(CSV_TEXT)))


def written(table: list[list[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(table)
    return buf.getvalue()


def refused(tmp_path, capsys, data, manifest=None) -> str:
    """The one error line of --import on `data` as profile.csv, checked to be a usage error."""
    code, out, err = run_cli(["profile", "--import", saved(tmp_path, data, manifest)], capsys)
    assert code == UsageError.exit_code and out == "", err
    (line,) = err.strip().splitlines()
    return line


def imported(tmp_path, capsys, data) -> tuple[dict, str]:
    code, out, err = run_cli(["profile", "--import", saved(tmp_path, data), "--json", "--top", 1000], capsys)
    assert code == 0, err
    return json.loads(out), err


def test_the_fixture_is_one_header_one_units_row_and_420_kernels():
    table = rows()
    assert table[0][0] == "ID" and table[1][0] == "" and len(table) == 422
    assert CSV_TEXT.endswith('"\n')


@pytest.mark.parametrize("how", ["blank line after the header", "\\r\\r\\n line ends"])
def test_blank_rows_are_read_past(how, tmp_path, capsys):
    if how.startswith("blank"):
        head, rest = CSV_TEXT.split("\n", 1)
        text = f"{head}\n\n{rest}\n\n"
    else:
        text = CSV_TEXT.replace("\n", "\r\r\n")
    d, _ = imported(tmp_path, capsys, text)
    assert d["kernel_count"] == 420


@pytest.mark.parametrize("name,data,tail", [
    ("utf-16", CSV_TEXT.encode("utf-16"), "is not UTF-8 text (invalid start byte at byte offset 0)"),
    ("gzip", (FIXTURE / "profile.csv.gz").read_bytes(), "is gzip-compressed; gunzip it first"),
    ("latin-1 name", CSV_TEXT.replace("_add_rmsnorm_kernel", "_add_rmsnorm_k\xe9rnel").encode("latin-1"),
     "is not UTF-8 text (invalid continuation byte at byte offset "),
])
def test_a_file_that_is_not_utf8_is_one_line(name, data, tail, tmp_path, capsys):
    line = refused(tmp_path, capsys, data)
    assert line.startswith(f"error: {tmp_path / 'p' / 'profile.csv'} {tail}"), line


@pytest.mark.parametrize("where", ["mid-row", "mid-cell"])
def test_a_file_cut_short_is_refused_not_read_as_fewer_kernels(where, tmp_path, capsys):
    lines = CSV_TEXT.splitlines(keepends=True)
    row = lines[300]            # kernel 298's row
    cut = row[:row.index('","', len(row) // 2) + 1] if where == "mid-row" else row[:row.index('"', len(row) // 2) + 3]
    line = refused(tmp_path, capsys, "".join(lines[:300]) + cut)
    what = "cut short: kernel row 298 has" if where == "mid-row" else "cut short inside its last row"
    assert what in line and "export it with: ncu --import" in line, line


def test_na_bytes_are_unknown_not_zero_and_counted_on_stderr(tmp_path, capsys):
    table = rows()
    read = table[0].index("dram__bytes_read.sum")
    lm_head = [r for r in table[2:] if '"<default domain>:lm_head:' in r[4]]
    for r in lm_head:
        r[read] = "n/a"
    d, err = imported(tmp_path, capsys, written(table))
    assert d["kernel_count"] == 420
    assert [k["dram_bytes"] for k in d["kernels"] if k["op"] == "lm_head"] == [None] * len(lm_head)
    assert all(k["dram_bytes"] is not None for k in d["kernels"] if k["op"] != "lm_head")
    assert f"{len(lm_head)} of 420 kernels have no DRAM bytes (n/a)" in err
    # a row holding such a kernel is unknown, not the smaller sum of the others
    assert {r["op"] for r in d["ops"] if r["dram_bytes"] is None} == {"lm_head", "total"}
    assert {r["scope"] for r in d["layers"] if r["dram_bytes"] is None} == {"lm_head"}


def test_na_times_are_counted_on_stderr(tmp_path, capsys):
    table = rows()
    table[2][table[0].index("gpu__time_duration.sum")] = "n/a"
    d, err = imported(tmp_path, capsys, written(table))
    assert d["kernel_count"] == 419 and "1 of 420 kernels have no time (n/a)" in err


def test_no_units_row_is_refused(tmp_path, capsys):
    table = rows()
    line = refused(tmp_path, capsys, written(table[:1] + table[2:]))
    assert "has no units row after its header" in line, line


def test_kernels_outside_salactls_ranges_are_refused_not_tabled_as_zeros(tmp_path, capsys):
    table = rows()
    for r in table[2:]:
        r[4] = ""                   # captured without --nvtx
    line = refused(tmp_path, capsys, written(table))
    assert "none of the 420 kernels in" in line and "ran inside salactl's NVTX range 'decode'" in line, line


@pytest.mark.parametrize("mixers", [5, "sparse", [1, 2], {"0": "minicpm4"}])
def test_mixer_types_of_the_wrong_shape_are_a_manifest_error(mixers, tmp_path, capsys):
    manifest = json.loads((FIXTURE / "step.json").read_text())
    manifest["config"]["mixer_types"] = mixers
    line = refused(tmp_path, capsys, CSV_TEXT, manifest)
    assert line.endswith("is not a salactl profile manifest: config.mixer_types is not a list of names; give a "
                         "directory written by salactl profile --ncu"), line
