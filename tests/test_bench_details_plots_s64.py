"""bench --details plots read the per-request CSV back by phase: a phase named with a leading '-' or
'+' (profile names allow them) is the phase's own name there, not the CSV's formula-guarded "'-fast"
(which the latency CDF and TTFT-vs-input legends then showed)."""

from salactl.bench.records import detail_rows, write_details
from salactl.bench.report_plots import read_details
from salactl.bench.requests import RequestResult


def _result(phase: str, i: int) -> RequestResult:
    return RequestResult(request_id=f"{phase}-{i}", phase=phase, input_len=16, expected_output_len=4,
                         start_time=1.0 + i, success=True, ttft=0.01 * (i + 1), latency=0.05 * (i + 1),
                         output_len=4, itl=[0.01, 0.01, 0.01])


def test_details_are_read_back_under_the_phases_own_names(tmp_path):
    results = [_result(p, i) for p in ("-fast", "+slow", "S1") for i in range(2)]
    path = tmp_path / "run-requests.csv"
    write_details(path, detail_rows("run", results, 0.0))
    assert "'-fast" in path.read_text(encoding="utf-8")        # the CSV guards the cell for spreadsheets
    details = read_details(path)
    assert list(details) == ["-fast", "+slow", "S1"]
    assert [r["ttft_ms"] for r in details["-fast"]] == [10.0, 20.0]
    assert [r["input_len"] for r in details["+slow"]] == [16, 16]
