"""Records files as `salactl report` reads them, at their edges: a line longer than any record
(/dev/zero) is refused at once, a pipe is read as it comes; a byte-order mark is read past;
records edited by hand (identity fields that are no strings, integers past float's range, infinite
or listed knobs, no model) give one-line errors, dropped values or no prediction, never a
traceback; the same file given twice counts once; a bad records file is exit 7, as other input
files; --overwrite leaves no report file of an earlier report; Markdown cells and headings escape
control characters."""

import json
import os
import resource
import subprocess
import sys

import pytest

from conftest import run_cli
from salactl.errors import DatasetError

ENV = {"gpu": "NVIDIA H200", "git_sha": "0123abc", "torch": "2.11.0"}


def record(label="a", phase="S1", knobs=None, **fields):
    """A bench phase record (salactl/bench/records.py make_record), with an allocator peak."""
    return {"schema_version": 1, "kind": "bench", "run_id": f"{label}-1", "label": label, "profile": "decode",
            "phase": phase, "target": "embedded", "model": "sala-nano",
            "timestamp": "2026-12-05T08:11:18.334674+00:00", "completed": 12, "failed": 0,
            "mean_ttft_ms": 10.0, "peak_gpu_memory_bytes": 62_000_000, **fields,
            "knobs": {"max_concurrency": 1, "input_len": 51, "output_len": 13, "dtype": "bfloat16",
                      "weights": "bf16", "kv_cache_dtype": "bf16", **(knobs or {})}, "env": ENV}


def write(path, *records, prefix: str = ""):
    path.write_text(prefix + "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def salactl_with_memory_limit(*args, timeout=60):
    """`salactl ARGS` in a process that may map at most 2 GiB more than this one (which has imported
    torch: a CUDA build alone maps more than 2 GiB): reading /dev/zero whole ends in a MemoryError
    there, not in this machine running out of memory."""
    with open("/proc/self/status") as status:
        vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    limit = vm + 2 * 2**30

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap)


def one_line(code, err, exit_code=DatasetError.exit_code) -> str:
    assert code == exit_code, (code, err)
    (line,) = err.strip().splitlines()
    assert line.startswith("error: "), line
    return line


# ---------------------------------------------------------------- files that are no records file
@pytest.mark.parametrize("cmd", [("report", "latency"), ("report", "memory", "--records")])
def test_dev_zero_ends_at_the_line_cap_not_read_whole(tmp_path, cmd):
    path = tmp_path / "records.jsonl"
    path.symlink_to("/dev/zero")
    r = salactl_with_memory_limit(*cmd, path)
    line = one_line(r.returncode, r.stderr)
    assert line.startswith(f"error: {path}:1 is over 64 MiB, longer than any record"), line


@pytest.mark.parametrize("cmd", [("report", "latency"), ("report", "memory", "--records")])
def test_a_pipe_is_read_as_it_comes(tmp_path, cmd):
    """`report latency <(cat records.jsonl)` or `... | report latency /dev/stdin`, as before the
    records file checks; a first line that is not a record is refused without reading the pipe again."""
    path = tmp_path / "records.jsonl"
    os.mkfifo(path)
    for text, code in ((json.dumps(record()) + "\n", 0), ("{\n", DatasetError.exit_code)):
        proc = subprocess.Popen([sys.executable, "-m", "salactl", *cmd, path, "--json"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        with open(path, "w") as writer:
            writer.write(text)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == code, err
        if code:
            assert one_line(code, err, code).startswith(f"error: {path}:1 is not valid JSON")


def test_a_line_longer_than_any_record_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "records.jsonl"
    write(path, record())
    with open(path, "r+b") as f:                 # a sparse tail of zeros without a line break
        f.truncate(path.stat().st_size + 65 * 2**20)
    r = salactl_with_memory_limit("report", "latency", path)
    assert one_line(r.returncode, r.stderr) == (f"error: {path}:2 is over 64 MiB, longer than any record "
                                                "(records files are JSON lines written by bench, sweep or run)")


def test_a_byte_order_mark_before_the_first_record_is_read_past(tmp_path, capsys):
    path = write(tmp_path / "records.jsonl", record(), record(phase="S8"), prefix="\ufeff")
    code, out, err = run_cli(["report", "latency", path, "--format", "csv"], capsys)
    assert code == 0 and err == "", err
    assert [row.split(",")[0] for row in out.splitlines()[1:]] == ["a", "a"]


@pytest.mark.parametrize("content", [b"not json\n", b"\xff\xfe\n", b"[1, 2]\n", b"\n"])
def test_a_bad_records_file_is_exit_7_as_a_bad_calib_file(tmp_path, capsys, content):
    path = tmp_path / "records.jsonl"
    path.write_bytes(content)
    code, out, err = run_cli(["report", "latency", path], capsys)
    assert str(path) in one_line(code, err) and out == ""
    calib = tmp_path / "c.jsonl"
    calib.write_bytes(b"not json\n")
    code, _, err = run_cli(["quantize", "--out", tmp_path / "q", "--calib", calib, "--nsamples", "1",
                            "--seqlen", "16"], capsys)
    assert code == DatasetError.exit_code == 7, err


# ---------------------------------------------------------------- records edited by hand
@pytest.mark.parametrize("field, value", [("model", {"x": 1}), ("run_id", ["r"]), ("label", ["A"]),
                                          ("profile", [1]), ("target", 3)])
def test_identity_fields_that_are_no_strings_are_one_line_errors(tmp_path, capsys, field, value):
    path = write(tmp_path / "records.jsonl", record(), record(phase="S8", **{field: value}))
    for cmd in (["report", "latency", path], ["report", "memory", "--records", path, "--gpu-mem", "80"]):
        code, out, err = run_cli(cmd, capsys)
        line = one_line(code, err)
        assert line.startswith(f"error: {path}:2: '{field}' must be a string or null, got ") and out == ""


def test_integers_past_floats_range_are_dropped_not_an_overflow(tmp_path, capsys):
    huge = 10**400
    path = write(tmp_path / "records.jsonl", record("a"), record("b", mean_ttft_ms=huge, duration=1.0),
                 record("c", phase="S8", peak_gpu_memory_bytes=huge))
    code, out, err = run_cli(["report", "latency", path, "--json"], capsys)
    assert code == 0, err
    assert err.strip() == (f"warning: dropped metric values that are not finite numbers: {path}:2 (mean_ttft_ms), "
                           f"{path}:3 (peak_gpu_memory_bytes)")
    assert [r["mean_ttft_ms"] for r in json.loads(out)["rows"]] == [10.0, None, 10.0]
    code, out, err = run_cli(["report", "memory", "--records", path, "--gpu-mem", "80", "--json"], capsys)
    assert code == 0, err
    assert [m["label"] for m in json.loads(out)["measured"]] == ["a", "b"]


@pytest.mark.parametrize("knobs", [{"input_len": float("inf")}, {"chunk_size": float("inf")},
                                   {"input_len": 1e300}, {"output_len": float("nan")}])
def test_knobs_that_are_no_finite_size_leave_the_prediction_unknown(tmp_path, capsys, knobs):
    path = write(tmp_path / "records.jsonl", record(knobs=knobs))
    code, out, err = run_cli(["report", "memory", "--records", path, "--gpu-mem", "80", "--json"], capsys)
    assert code == 0, err
    (row,) = json.loads(out)["measured"]
    if "input_len" in knobs:
        assert row["context"] is None and row["predicted"] is None
    else:
        assert row["predicted"] is not None           # the chunk from --chunk-size, the context from the knobs


def test_a_dtype_knob_that_is_no_name_is_unknown(tmp_path, capsys):
    path = write(tmp_path / "records.jsonl", record(knobs={"dtype": ["float32"]}))
    code, out, err = run_cli(["report", "memory", "--records", path, "--gpu-mem", "80", "--json"], capsys)
    assert code == 0, err
    (row,) = json.loads(out)["measured"]
    assert row["weights"] == "bf16" and row["predicted"] is not None      # the bf16 weights say 16-bit


@pytest.mark.parametrize("model", ["missing", None, ""])
def test_a_record_naming_no_model_gets_no_prediction_and_a_note(tmp_path, capsys, model):
    rec = record()
    if model == "missing":
        del rec["model"]
    else:
        rec["model"] = model
    path = write(tmp_path / "records.jsonl", rec, record(phase="S8"))
    code, out, err = run_cli(["report", "memory", "--records", path, "--gpu-mem", "80", "--json"], capsys)
    assert code == 0, err
    assert [m["predicted"] is None for m in json.loads(out)["measured"]] == [True, False]
    assert err.strip() == ("note: 1 measured record(s) name no model: no prediction for them (not with --model "
                           "sala-nano's shapes)")


# ---------------------------------------------------------------- the same records twice
def test_a_file_given_twice_counts_each_record_once(tmp_path, capsys):
    path = write(tmp_path / "records.jsonl", record("a"), record("b", mean_ttft_ms=20.0))
    code, out, err = run_cli(["report", "latency", path, path, "--json"], capsys)
    assert code == 0
    assert [r["label"] for r in json.loads(out)["rows"]] == ["a", "b"]
    assert err.strip() == (f"warning: dropped 2 record(s) identical to one read before (a file given twice?): "
                           f"{path}:1, {path}:2")
    code, out, err = run_cli(["report", "memory", "--records", path, "--records", path, "--gpu-mem", "80",
                              "--json"], capsys)
    assert code == 0 and len(json.loads(out)["measured"]) == 2, err


def test_records_that_differ_are_kept_even_with_the_same_run_and_phase(tmp_path, capsys):
    path = write(tmp_path / "records.jsonl", record("a"), record("a", mean_ttft_ms=1.0))
    code, out, err = run_cli(["report", "latency", path, "--json"], capsys)
    assert code == 0 and err == "" and len(json.loads(out)["rows"]) == 2


# ---------------------------------------------------------------- report files of an earlier report
def test_overwrite_with_fewer_formats_removes_the_earlier_reports_other_files(tmp_path, capsys):
    path = write(tmp_path / "records.jsonl", record())
    out = tmp_path / "rep"
    assert run_cli(["report", "latency", path, "--out", out, "--format", "md,csv"], capsys)[0] == 0
    code, _, err = run_cli(["report", "latency", path, "--out", out, "--format", "csv", "--overwrite"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["report.csv"]
    code, _, err = run_cli(["report", "latency", path, "--out", out, "--format", "md"], capsys)
    assert code == 0 and sorted(p.name for p in out.iterdir()) == ["report.csv", "report.md"]
    assert f"note: kept report.csv of an earlier report in {out}; --overwrite removes" in err


# ---------------------------------------------------------------- Markdown
def test_markdown_escapes_control_characters_and_pipes_in_cells_and_headings(tmp_path, capsys):
    path = write(tmp_path / "records.jsonl", record("x\ny|z"), record("w", phase="S\r1"),
                 {**record("sw\x1b[31m"), "kind": "sweep", "phase": "dl16\nx"})
    code, out, err = run_cli(["report", "latency", path, "--title", "T\nitle"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "# T\\nitle"
    assert "## phase: S\\r1" in lines and "## sweep: sw\\x1b[31m" in lines
    assert not any(c in out for c in "\r\x1b")
    table_rows = [line for line in lines if line.startswith("|")]
    assert any("x\\ny\\|z" in line for line in table_rows) and any("dl16\\nx" in line for line in table_rows)
    assert not any(text in out for text in ("x\ny", "dl16\nx", "T\nitle"))     # no heading or row split
