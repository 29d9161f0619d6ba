"""An --out that is a symlink to a missing target is refused before any work (run, bench, sweep,
report, quantize; a link to a directory still works); report latency --json without --out refuses --format and
--title, which only change report files; a report of several sweeps shows the knob that sets them
apart; and a --resume'd sweep's points are named in the report as that sweep names them."""

import json
import subprocess
import sys

import pytest

MISSING = "error: --out {out} is a symlink to {target}, which does not exist; remove the link or point --out elsewhere"


def salactl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def sweep(out, *args):
    r = salactl("sweep", "--no-kl", "--no-passkey", "--device", "cpu", "--input-len", 16, "--output-len", 2,
                "--requests", 1, "--out", out, *args)
    assert r.returncode == 0, r.stderr
    return out / "records.jsonl"


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """Real sweep records: two sweeps that differ only in --topk (separate --outs, no --label), and a
    --label L sweep resumed with a --topk grid (its first two points reused)."""
    root = tmp_path_factory.mktemp("sweeps")
    tk2 = sweep(root / "tk2", "--dense-len", "64,256", "--topk", 2)
    tk4 = sweep(root / "tk4", "--dense-len", "64,256", "--topk", 4)
    sweep(root / "res", "--dense-len", "64,256", "--label", "L")
    resumed = sweep(root / "res", "--dense-len", "64,256", "--topk", "4,2", "--label", "L", "--resume")
    return {"tk2": tk2, "tk4": tk4, "resumed": resumed}


# ---------------------------------------------------------------- a dangling-symlink --out
# each small enough that, were the link not refused, the job would soon end (and fail on the link)
@pytest.mark.parametrize("command", [
    ("run", "-p", "x", "--max-new-tokens", 2, "--device", "cpu"),
    ("bench", "--scale", "0.01", "--phases", "S1", "--num-requests", 1, "--device", "cpu"),
    ("sweep", "--no-kl", "--no-passkey", "--device", "cpu", "--input-len", 16, "--output-len", 2, "--requests", 1),
    ("report", "latency", "RECORDS"),
    ("quantize", "--method", "rtn", "--device", "cpu")])
def test_an_out_linked_to_a_missing_target_is_refused_before_any_work(tmp_path, sweeps, command):
    (tmp_path / "L").symlink_to(tmp_path / "missing")
    args = [str(sweeps["tk2"]) if a == "RECORDS" else a for a in command]
    r = salactl(*args, "--out", "L", cwd=tmp_path)
    assert (r.returncode, r.stderr.strip()) == (2, MISSING.format(out="L", target=tmp_path / "missing"))
    assert r.stdout == "" and not (tmp_path / "missing").exists()
    below = salactl(*args, "--out", "L/sub", cwd=tmp_path)        # the link is a directory above --out
    assert below.returncode == 2 and "--out L/sub: L is a symlink to" in below.stderr, below.stderr


def test_an_out_linked_to_a_directory_still_works(tmp_path, sweeps):
    (tmp_path / "real").mkdir()
    (tmp_path / "G").symlink_to("real")
    r = salactl("report", "latency", sweeps["tk2"], "--out", "G", "--format", "md", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "real" / "report.md").is_file()
    r = salactl("run", "-p", "hi", "--max-new-tokens", 2, "--device", "cpu", "--out", "G", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert {json.loads(x)["kind"] for x in (tmp_path / "real" / "records.jsonl").read_text().splitlines()} == {"run"}
    r = salactl("quantize", "--method", "rtn", "--device", "cpu", "--out", "G/q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "real" / "q" / "config.json").is_file() and (tmp_path / "G").is_symlink()


# ---------------------------------------------------------------- --json without --out
@pytest.mark.parametrize("flags", [("--format", "csv"), ("--format", "md"), ("--title", "Foo")])
def test_json_without_out_refuses_format_and_title(sweeps, flags):
    r = salactl("report", "latency", sweeps["tk2"], "--json", *flags)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"error: {flags[0]} applies to the report files written to --out (--json alone prints "
                        "only the JSON); add --out DIR, or drop it\n")


def test_json_with_out_takes_format_and_title(tmp_path, sweeps):
    r = salactl("report", "latency", sweeps["tk2"], "--json", "--format", "md", "--title", "Foo", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files"] == [str(tmp_path / "report.md")]
    assert (tmp_path / "report.md").read_text().startswith("# Foo\n")
    assert salactl("report", "latency", sweeps["tk2"], "--json").returncode == 0


# ---------------------------------------------------------------- sweeps in one report
def report(tmp_path, *records):
    r = salactl("report", "latency", *records, "--json", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()


def test_each_sweep_table_shows_the_knob_that_sets_the_sweeps_apart(tmp_path, sweeps):
    rep, md, html = report(tmp_path, sweeps["tk2"], sweeps["tk4"])
    tables = rep["sweeps"]
    assert len(tables) == 2
    for t, topk in zip(tables, (2, 4)):
        assert t["knobs"] == ["dense_len"]                      # what varies inside it, the sort keys
        assert t["columns"][:3] == ["phase", "knob.dense_len", "knob.topk"]
        assert [(row["phase"], row["knob.dense_len"], row["knob.topk"]) for row in t["rows"]] == [
            ("dl64", 64, topk), ("dl256", 256, topk)]
    assert md.count("| point | knob.dense_len | knob.topk |") == 2
    assert "| dl64 | 64 | 2 |" in md and "| dl64 | 64 | 4 |" in md
    assert html.count("<th>knob.topk</th>") == 2, html


def test_one_sweep_shows_no_knob_column_beyond_those_that_vary(tmp_path, sweeps):
    (t,) = report(tmp_path, sweeps["tk2"])[0]["sweeps"]
    assert not any(c.startswith("knob.") for c in t["columns"] if c != "knob.dense_len")


def test_resumed_points_are_named_as_the_resumed_sweep_names_them(tmp_path, sweeps):
    lines = [json.loads(x) for x in sweeps["resumed"].read_text().splitlines()]
    assert [r["phase"] for r in lines] == ["dl64", "dl256", "dl64-tk2", "dl256-tk2"]    # records keep theirs
    summary = max(sweeps["resumed"].parent.glob("*-sweep.json"))                     # the resumed sweep's
    knobs = {r["point_key"]: (r["knobs"]["dense_len"], r["knobs"]["topk"]) for r in lines}
    own = {knobs[p["point_key"]]: p["phase"] for p in json.loads(summary.read_text())["points"]}
    rep, md, _ = report(tmp_path, sweeps["resumed"])
    (t,) = rep["sweeps"]
    assert [row["phase"] for row in t["rows"]] == ["dl64-tk2", "dl64-tk4", "dl256-tk2", "dl256-tk4"]
    assert all(row["phase"] == own[row["knob.dense_len"], row["knob.topk"]] for row in t["rows"])
    assert "| dl64-tk4 |" in md and "| dl64 |" not in md
    assert [r["phase"] for r in rep["rows"]] == ["dl64-tk2", "dl64", "dl256-tk2", "dl256"]     # CSV: as recorded
