"""The Nsight Compute raw-CSV parser and the ncu table (`salactl profile --import DIR`).

The CSV below is HAND-WRITTEN in the layout of `ncu --import R.ncu-rep --csv --page raw
--print-units base` (header row, units row, one row per kernel; the NVTX push/pop column holds the
thread id and one quoted `<domain>:<range>:<6 attribute fields>` entry per open range).
tests/fixtures/ncu/ holds a REAL capture: `salactl profile --ncu --phase decode --model sala-9b
--random-weights --context 4096` on one H200 (profile.csv gzipped as exported by ncu 2025.3 +
the step.json manifest; BENCHMARKS.md, section "profile --ncu"). Its manifest says "reference"
backend because of a labelling bug fixed since: the step was the GPU engine's (420 kernels)."""

import json
import os
import subprocess
import sys

import pytest

from salactl.errors import UsageError
from salactl.reports.ncu import parse_csv_text, parse_nvtx
from salactl.reports.profile_table import from_ncu

NVTX_COL = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
HEADER = ["ID", "Process ID", "Process Name", "Host Name", NVTX_COL,
          "Id:Domain:Start/Stop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg", "Kernel Name",
          "Context", "Stream", "Block Size", "Grid Size", "Device", "CC", "dram__bytes_read.sum",
          "dram__bytes_write.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
          "gpu__time_duration.sum"]
UNITS = [""] * 13 + ["byte", "byte", "%", "nsecond"]


def nvtx(*ranges):
    return "1  " + "  ".join(f'"<default domain>:{r}:none:none:none:none:none:none"' for r in ranges) + " "


def row(i, stack, name, read, write, pct, ns):
    return [str(i), "1612", "python3.12", "127.0.0.1", nvtx(*stack), "", name, "1", "7", "(128, 1, 1)",
            "(64, 1, 1)", "0", "9.0", read, write, pct, ns]


def to_csv(rows):
    import csv
    import io

    buf = io.StringIO()
    buf.write("==PROF== Disconnected from process 1612\n")
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    for r in [HEADER, UNITS, *rows]:
        w.writerow(r)
    return buf.getvalue()


KERNELS = [
    row(0, ("decode", "layer1", "qkv"), "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT", "100,663,296", "4,096",
        "82.5", "27,500"),
    row(1, ("decode", "layer1", "qkv"), "vectorized_elementwise_kernel", "16,384", "16,384", "1.2", "2,100"),
    row(2, ("decode", "layer1"), "reduce_kernel", "8,192", "64", "0.4", "3,000"),
    row(3, ("decode", "layer1", "mlp"), "gemvNSP_kernel", "402,653,184", "32,768", "88.0", "95,000"),
    row(4, ("decode", "lm_head"), "gemvNSP_kernel", "601,686,016", "293,792", "90.1", "140,250"),
    row(5, ("decode",), "indexSelectSmallIndex", "8,192", "8,192", "0.1", "1,800"),
]


def test_parse_nvtx_cell():
    assert parse_nvtx(nvtx("decode", "layer3", "gla")) == ["decode", "layer3", "gla"]
    assert parse_nvtx('7  "<default domain>:mod:x.y:none:none:none:none:none:none"') == ["mod:x.y"]
    assert parse_nvtx("") == []


def test_parse_csv_units_separators_and_attribution():
    ks = parse_csv_text(to_csv(KERNELS))
    assert len(ks) == 6
    k = ks[0]
    assert k.name.startswith("nvjet") and k.nvtx == ["decode", "layer1", "qkv"]
    assert k.time_s == pytest.approx(27.5e-6) and k.dram_read == 100663296 and k.dram_write == 4096
    assert k.dram_pct == 82.5 and k.sm_pct is None
    s = from_ncu(ks)
    assert [(x.phase, x.layer, x.op) for x in s] == [
        ("decode", 1, "qkv"), ("decode", 1, "qkv"), ("decode", 1, "other"), ("decode", 1, "mlp"),
        ("decode", None, "lm_head"), ("decode", None, "other")]
    assert s[0].mem_pct == 82.5          # DRAM % stands in when the SOL metrics were not collected


def test_parse_csv_rejects_foreign_text():
    with pytest.raises(UsageError, match="no kernel table"):
        parse_csv_text("hello\n")
    with pytest.raises(UsageError, match="lacks columns"):
        parse_csv_text('"ID","Kernel Name"\n"","",\n"0","k"\n')
    bad_unit = to_csv(KERNELS).replace('"nsecond"', '"fortnight"')
    with pytest.raises(UsageError, match="unknown unit"):
        parse_csv_text(bad_unit)


def test_profile_import_joins_with_the_analytic_model(tmp_path):
    out = tmp_path / "prof"
    p = subprocess.run([sys.executable, "-m", "salactl", "profile", "--torch", "--model", "sala-nano",
                        "--random-weights", "--phase", "decode", "--context", "64", "--device", "cpu",
                        "--layers", "1,lm_head", "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (out / "profile.csv").write_text(to_csv(KERNELS))
    manifest = json.loads((out / "step.json").read_text())
    manifest.update(mode="ncu", device="cuda:0", device_name="NVIDIA H200")     # as if captured on the H200
    (out / "step.json").write_text(json.dumps(manifest))
    env = {**os.environ, "SALACTL_CACHE_DIR": str(tmp_path / "cache")}   # datasheet peaks
    res = subprocess.run([sys.executable, "-m", "salactl", "profile", "--import", str(out), "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["peaks"]["mem_gbps"] == 4800.0
    analytic = manifest["steps"]["decode"]["analytic"]
    ops = {r["op"]: r for r in d["ops"]}
    assert ops["qkv"]["kernels"] == 2 and ops["qkv"]["dram_bytes"] == 100663296 + 4096 + 2 * 16384
    assert ops["qkv"]["analytic_bytes"] == analytic["qkv"]["bytes"]
    assert ops["qkv"]["bytes_ratio"] == pytest.approx(ops["qkv"]["dram_bytes"] / analytic["qkv"]["bytes"])
    assert ops["lm_head"]["time_s"] == pytest.approx(140.25e-6)
    assert ops["other"]["kernels"] == 1          # the embedding kernel is outside the --layers scopes
    top = d["kernels"][0]                        # most time beyond its bytes' floor at 4.8 TB/s first
    assert (top["name"], top["op"]) == ("gemvNSP_kernel", "lm_head")
    assert top["floor_s"] == pytest.approx((601686016 + 293792) / 4.8e12)
    assert top["achieved_gbps"] == pytest.approx((601686016 + 293792) / 140.25e-6 / 1e9)
    assert d["ops"][-1]["op"] == "total"


def test_report_file_is_the_name_ncu_writes():
    from pathlib import Path

    from salactl.profiling.ncu_runner import report_file

    assert report_file(Path("/x/.profile.tmp")) == Path("/x/.profile.tmp.ncu-rep")


def test_real_h200_capture_parses_and_matches_the_analytic_weight_bytes(tmp_path):
    """The whole 9B decode step captured on the H200: every kernel is attributed to an op through
    its NVTX ranges, and the weight-streaming ops read their analytic bytes within 15%."""
    import gzip
    import shutil
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "ncu"
    out = tmp_path / "prof"
    out.mkdir()
    (out / "profile.csv").write_bytes(gzip.decompress((fixture / "profile.csv.gz").read_bytes()))
    shutil.copy(fixture / "step.json", out / "step.json")
    kernels = parse_csv_text((out / "profile.csv").read_text())
    assert len(kernels) == 420
    env = {**os.environ, "SALACTL_CACHE_DIR": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-m", "salactl", "profile", "--import", str(out), "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    ops = {r["op"]: r for r in d["ops"]}
    assert ops["mlp"]["kernels"] == 128 and ops["qkv"]["kernels"] == 64 and ops["lm_head"]["kernels"] == 3
    for op in ("qkv", "o_proj", "mlp", "lm_head"):
        assert 0.85 <= ops[op]["bytes_ratio"] <= 1.15, (op, ops[op]["bytes_ratio"])
    assert ops["mlp"]["dram_bytes"] == pytest.approx(12 * 2 ** 30, rel=0.01)     # 32 x 3 x 4096 x 16384 x 2 B
    assert 4e-3 < ops["total"]["time_s"] < 8e-3


def test_na_bytes_stay_unknown_and_na_times_are_counted(capsys):
    """ncu writes n/a where a counter gave no value: bytes stay None (not 0 B as if measured), a
    kernel without a time is left out, and stderr says how many of each."""
    rows = [list(r) for r in KERNELS]
    rows[1][HEADER.index("dram__bytes_read.sum")] = "n/a"
    rows[2][HEADER.index("gpu__time_duration.sum")] = "n/a"
    ks = parse_csv_text(to_csv(rows), "p.csv")
    assert [k.id for k in ks] == [0, 1, 3, 4, 5]
    assert ks[1].dram_read is None and ks[1].dram_bytes is None and ks[0].dram_bytes == 100663296 + 4096
    err = capsys.readouterr().err
    assert "p.csv: 1 of 6 kernels have no time (n/a)" in err
    assert "p.csv: 1 of 6 kernels have no DRAM bytes (n/a)" in err


def test_units_row_is_required():
    """Without the units row the times would be read as seconds (1e9x too large)."""
    text = to_csv(KERNELS).replace(",".join(f'"{u}"' for u in UNITS) + "\r\n", "")
    assert text.count("\n") == len(KERNELS) + 2
    with pytest.raises(UsageError, match="no units row"):
        parse_csv_text(text)
    no_time_unit = to_csv(KERNELS).replace('"nsecond"', '""')
    with pytest.raises(UsageError, match="no unit for gpu__time_duration.sum"):
        parse_csv_text(no_time_unit)


def test_a_table_cut_short_is_refused_while_ncu_log_lines_are_skipped():
    full = to_csv(KERNELS)
    with pytest.raises(UsageError, match="cut short inside its last row"):
        parse_csv_text(full[:full.rindex('"1,800"') + 3])            # ends in the open cell "1,
    rows = full.splitlines()
    short = "\n".join(rows[:5] + [rows[5][:rows[5].index(',"(128')]] + rows[6:])   # kernel 2 cut mid-row
    with pytest.raises(UsageError, match="cut short: kernel row 2 has 9 of 17 columns"):
        parse_csv_text(short)
    noisy = "\n".join(rows[:4] + ['==WARNING== Found outstanding GPU clock reset, trying to revert...'] + rows[4:]
                      + ["==PROF== Report: /tmp/x.ncu-rep", ""])
    assert len(parse_csv_text(noisy)) == 6


def test_blank_rows_and_doubled_carriage_returns_are_read_as_ncu_wrote_them():
    text = to_csv(KERNELS)
    header_end = text.index("\r\n", text.index('"ID"')) + 2
    assert len(parse_csv_text(text[:header_end] + "\r\n" + text[header_end:])) == 6
    assert len(parse_csv_text(text.replace("\r\n", "\r\r\n"))) == 6
