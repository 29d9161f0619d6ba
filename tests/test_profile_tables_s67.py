"""profile's tables read consistently: the header's kernel count says which kernels the phases' total
rows leave out (an imported capture's kernels outside salactl's NVTX ranges), the unattributed row's
rates are unknown ('-', null), not 0, and kernel names cut for the text table stay distinct."""

import csv
import io
import json

import pytest

from conftest import run_cli
from test_profile_import import ncu_profile_dir


@pytest.fixture(autouse=True)
def datasheet_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path / "cache"))


def add_unranged_kernels(saved, n: int) -> None:
    """Append n copies of the CSV's last kernel launched outside every NVTX range."""
    path = saved / "profile.csv"
    rows = list(csv.reader(io.StringIO(path.read_text())))
    nvtx = next(i for i, h in enumerate(rows[0]) if "Push/Pop_Range" in h)
    last_id = int(rows[-1][0])
    extra = [[str(last_id + 1 + j), *rows[-1][1:nvtx], "1912 ", *rows[-1][nvtx + 1:]] for j in range(n)]
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(extra)
    path.write_text(path.read_text() + out.getvalue())


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def test_the_header_says_how_many_kernels_fall_outside_the_profiled_phases(tmp_path, capsys):
    saved = ncu_profile_dir(tmp_path / "p")
    code, out, err = run_cli(["profile", "--import", saved], capsys)
    assert code == 0, err
    assert out.splitlines()[0].endswith("; 420 kernels"), out.splitlines()[0]
    add_unranged_kernels(saved, 10)
    code, out, err = run_cli(["profile", "--import", saved], capsys)
    assert code == 0, err
    assert out.splitlines()[0].endswith("; 430 kernels, 10 outside the profiled phases"), out.splitlines()[0]
    (total,) = [r for r in table_rows(out) if r[0] == "total"]
    assert total[1] == "420"


def test_the_unattributed_rows_rates_are_unknown_not_zero(capsys):
    from salactl.cmd_profile import render
    from salactl.profiling.session import tables
    from salactl.reports.profile_table import UNATTRIBUTED, KernelSample

    costs = {op: {"bytes": 0, "flops": 0} for op in ("qkv", "attention", "gla", "gates", "o_proj", "mlp",
                                                       "lm_head", "other")}
    costs["mlp"] = {"bytes": 1e6, "flops": 1e6}
    manifest = {"mode": "torch", "device": "cpu", "device_name": "cpu", "source": "test", "dtype": "float32",
                "kv_dtype": "float32", "weights": "float32",
                "steps": {"decode": {"analytic": costs, "wall_s": 0.006, "batch": 1, "new_tokens": 1,
                                     "cached_tokens": 16}}}
    peaks = {"mem_gbps": 20.0, "compute_tflops": 0.2, "compute_rate": "fp32", "bf16_tflops": 0.2,
             "source": "cpu-default"}
    t = tables([KernelSample("aten::mm", "decode", 0, "mlp", 0.005)], manifest, peaks, 20)
    rest = json.loads(json.dumps(t))["ops"][-2]
    assert rest["op"] == UNATTRIBUTED and rest["time_s"] == pytest.approx(0.001)
    assert [rest[k] for k in ("achieved_gbps", "achieved_tflops", "pct_of_peak_bw", "pct_of_peak")] == [None] * 4
    render({"mode": "torch", "manifest": manifest, "peaks": peaks, **t})
    (row,) = [r for r in table_rows(capsys.readouterr().out) if r[0] == UNATTRIBUTED]
    # op, aten ops, time ms, GB/s, TFLOP/s, % peak BW, % peak, ...
    assert row[3:7] == ["-"] * 4, row


def test_cut_kernel_names_do_not_read_as_duplicate_rows(tmp_path, capsys):
    """The real capture's two direct_copy kernels (float and int instances) share their first 60
    characters and both run in decode's 'other' op."""
    saved = ncu_profile_dir(tmp_path / "p")
    code, out, err = run_cli(["profile", "--import", saved, "--top", "1000", "--json"], capsys)
    assert code == 0, err
    full = {(k["name"], k["phase"], k["op"]) for k in json.loads(out)["kernels"]}
    assert any(len(name) > 60 for name, _, _ in full)
    code, out, err = run_cli(["profile", "--import", saved, "--top", "1000"], capsys)
    assert code == 0, err
    kernels = out.split("kernels (top offenders")[1]
    shown = [(r[0], r[1], r[2]) for r in table_rows(kernels)]
    assert len(shown) == len(full) == len(set(shown))
    assert all(len(name) <= 60 for name, _, _ in shown)
