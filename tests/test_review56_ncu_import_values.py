"""`salactl profile --import DIR` on the real H200 capture (tests/fixtures/ncu) with a kernel cost
that is no cost (inf, nan, negative, text, too large for a float), a kernel ID that is no number,
a negative analytic cost in step.json, or a profile.csv cut just before its last line end: one line
naming the row, the metric and the cell, exit 2, never a table built from it. A cut just after a
line end leaves what a shorter capture (ncu --launch-count) writes, so that file is read."""

import json
import shutil

import pytest

from salactl.errors import UsageError
from salactl.reports.ncu import SM_PCT, parse_csv_text

from conftest import run_cli
from test_ncu_import_variants import CSV_TEXT, FIXTURE, rows, written
HINT = "export it with: ncu --import R.ncu-rep --csv --page raw --print-units base"
TIME, READ = "gpu__time_duration.sum", "dram__bytes_read.sum"


@pytest.fixture(autouse=True)
def datasheet_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path / "cache"))


def with_cell(column: str, value: str, kernel: int = 7) -> str:
    table = rows()
    table[2 + kernel][table[0].index(column)] = value
    return written(table)


def import_cli(tmp_path, capsys, csv_text: str, manifest: dict | None = None) -> tuple[int, str, str]:
    out = tmp_path / "p"
    out.mkdir()
    (out / "profile.csv").write_text(csv_text)
    if manifest is None:
        shutil.copy(FIXTURE / "step.json", out / "step.json")
    else:
        (out / "step.json").write_text(json.dumps(manifest))
    return run_cli(["profile", "--import", out, "--json"], capsys)


def refused(tmp_path, capsys, csv_text: str, manifest: dict | None = None) -> str:
    code, out, err = import_cli(tmp_path, capsys, csv_text, manifest)
    assert code == UsageError.exit_code and out == "" and "Traceback" not in err, err
    (line,) = err.strip().splitlines()
    return line


BAD_COSTS = [(TIME, "inf"), (TIME, "nan"), (TIME, "-2,048"), (TIME, "1e400"), (TIME, "fast"),
             (READ, "-1"), (READ, "Infinity"), (READ, "12 KB"), ("dram__bytes_write.sum", "-0.5"),
             ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "-3"),
             ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "high")]


@pytest.mark.parametrize("column,value", BAD_COSTS)
def test_a_cost_that_is_no_cost_names_row_metric_and_cell(tmp_path, capsys, column, value):
    line = refused(tmp_path, capsys, with_cell(column, value))
    assert line == (f"error: {tmp_path / 'p' / 'profile.csv'}: kernel row 7 has {column} {value!r}, not a finite "
                    f"non-negative number; {HINT}")


def test_a_cost_too_large_in_base_units_is_refused():
    """1e300 Gbyte is a finite cell, but not a finite number of bytes."""
    table = rows()
    i = table[0].index(READ)
    table[1][i], table[2][i] = "Gbyte", "1e300"
    with pytest.raises(UsageError, match=f"kernel row 0 has {READ} '1e300', not a finite non-negative number"):
        parse_csv_text(written(table))


def test_a_percentage_over_zero_cycles_stays_unknown_while_costs_are_kept():
    """A percentage is a ratio, which ncu may write as nan or inf: unknown, as n/a, not a refusal."""
    table = rows()
    header = table[0] + [SM_PCT]
    body = [r + ["nan" if i == 3 else "inf" if i == 4 else "12.5"] for i, r in enumerate(table[2:])]
    kernels = parse_csv_text(written([header, table[1] + ["%"], *body]))
    assert [k.sm_pct for k in kernels[2:6]] == [12.5, None, None, 12.5]
    assert all(k.time_s > 0 for k in kernels) and len(kernels) == 420


@pytest.mark.parametrize("kernel_id", ["7.5", "x", "-7", "\u00b2", "\u0661"])   # superscript 2, Arabic-Indic 1
def test_a_kernel_id_that_is_no_whole_number_is_refused(tmp_path, capsys, kernel_id):
    line = refused(tmp_path, capsys, with_cell("ID", kernel_id))
    assert line == (f"error: {tmp_path / 'p' / 'profile.csv'} has a kernel row whose ID {kernel_id!r} is not a "
                    f"whole number; {HINT}")


@pytest.mark.parametrize("cut", ["after the last closing quote", "after the last comma"])
def test_a_cut_before_the_last_line_end_is_refused(tmp_path, capsys, cut):
    text = CSV_TEXT.rstrip("\n")
    text = text if cut.endswith("quote") else text[:text.rindex('","') + 2]
    assert text.count("\n") == 421 and text.count('"') % 2 == 0      # every row whole, every cell closed
    line = refused(tmp_path, capsys, text)
    assert line == (f"error: {tmp_path / 'p' / 'profile.csv'} is cut short: its last row has no line end (ncu "
                    f"ends every row with one); {HINT}")


def test_a_cut_just_after_a_line_end_reads_as_the_shorter_capture_it_equals(tmp_path, capsys):
    shorter = "".join(CSV_TEXT.splitlines(keepends=True)[:302])       # as --launch-count 300 writes it
    code, out, err = import_cli(tmp_path, capsys, shorter)
    assert code == 0, err
    assert json.loads(out)["kernel_count"] == 300


@pytest.mark.parametrize("key", ["bytes", "flops", "bf16_flops"])
def test_a_negative_analytic_cost_in_the_manifest_is_refused(tmp_path, capsys, key):
    manifest = json.loads((FIXTURE / "step.json").read_text())
    manifest["steps"]["decode"]["analytic"]["mlp"][key] = -1
    line = refused(tmp_path, capsys, CSV_TEXT, manifest)
    assert line == (f"error: {tmp_path / 'p' / 'step.json'} is not a salactl profile manifest: "
                    f"steps.decode.analytic.mlp.{key} is negative (-1); give a directory written by salactl "
                    "profile --ncu")


def test_a_kernel_id_with_thousands_separators_reads_as_its_number():
    kernels = parse_csv_text(with_cell("ID", "1,000"))
    assert 1000 in [k.id for k in kernels] and len(kernels) == 420


@pytest.mark.parametrize("ending", ["blanks after the last line end", "CRLF cut between CR and LF",
                                    "a last ==PROF== line without its line end", "a short row that is no kernel"])
def test_endings_a_whole_export_can_have_are_read(ending):
    text = {"blanks after the last line end": CSV_TEXT + "  \t",
            "CRLF cut between CR and LF": CSV_TEXT.replace("\n", "\r\n")[:-1],
            "a last ==PROF== line without its line end": CSV_TEXT + "==PROF== Disconnected from process 1",
            "a short row that is no kernel": "".join(
                (lambda ls: ls[:2] + ['"x"\n'] + ls[2:])(CSV_TEXT.splitlines(keepends=True)))}[ending]
    assert len(parse_csv_text(text)) == 420
