"""The output contract end to end: tables that keep every digit on a narrow terminal, help without
an error for bare command groups, a quiet exit on a closed pipe, what `--json` lists, JSON numbers,
the latency report's headers and CSV, and the wording of stderr lines."""

import csv
import io
import json
import os
import pty
import shutil
import subprocess
import sys

import pytest
from rich.console import Console
from safetensors.torch import load_file, save_file

from conftest import run_cli
from salactl import output
from salactl.runtime.loader import EMBEDDED_DIR


def salactl(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def on_terminal(args: list, columns: int) -> str:
    """stdout of `salactl ARGS` written to a pseudo-terminal `columns` wide (stderr dropped)."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "salactl", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:                 # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0
    return b"".join(chunks).decode()


def test_bench_table_keeps_every_digit_and_header_on_a_60_column_terminal(tmp_path):
    text = on_terminal(["bench", "--profile", "soar", "--scale", "0.002", "--num-requests", "2", "--device",
                        "cpu", "--out", tmp_path / "b"], columns=60)
    assert "duration s" in text and "E2E ms" in text and "Smax" in text
    assert "…" not in text


def test_a_table_wider_than_the_piped_width_is_not_cropped():
    """Piped stdout is 160 columns; the GPU bench columns make a table wider than that."""
    console = Console(file=io.StringIO(), width=160, soft_wrap=True, markup=False)
    columns = ["phase", "concurrency", "rate req/s", "ok", "failed", "duration s", "req/s", "out tok/s",
               "TTFT ms", "p99 TTFT", "TPOT ms", "ITL ms", "p99 ITL", "E2E ms", "peak GiB", "W", "J/out tok"]
    output.table("bench", columns, [["S1", 1, float("inf"), 2, 0, 0.0123456, 20.5, 5555.1, 2.2, 45.12, 7.5,
                                     7.7, 7.1, 35.2, 1.234, 350.5, 0.00123]], console=console)
    text = console.file.getvalue()
    assert "…" not in text and all(c in text for c in columns) and "0.00123" in text and "0.01235" in text


@pytest.mark.parametrize("args", [[], ["eval"], ["report"]])
def test_a_bare_command_group_prints_its_help_without_an_error(capsys, args):
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == ""
    assert err.startswith("Usage: ") and "Commands:" in err
    assert "error:" not in err and "--help')" not in err


@pytest.mark.parametrize("args", [["report", "memory"], ["report", "memory", "--json"]])
def test_a_closed_stdout_pipe_exits_141_without_a_word(args):
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "salactl", *args], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    os.close(read_end)                  # the reader is gone before the first write
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141 and err == b""


def test_run_json_with_out_names_its_run_id_and_records_and_counts_as_integers(tmp_path, capsys):
    code, out, err = run_cli(["run", "-p", "def f(x):", "-n", "3", "--device", "cpu", "--out", tmp_path / "r",
                              "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    records = [json.loads(x) for x in (tmp_path / "r" / "records.jsonl").read_text().splitlines()]
    assert result["files"] == {"records": str(tmp_path / "r" / "records.jsonl")}
    assert {r["run_id"] for r in records} == {result["run_id"]}
    rows = result["roofline"]["prefill"] + result["roofline"]["decode"]
    assert rows and all(type(r["bytes"]) is int and type(r["flops"]) is int for r in rows)


def test_profile_lists_the_result_json_it_writes(tmp_path, capsys):
    out = tmp_path / "p"
    code, stdout, err = run_cli(["profile", "--torch", "--phase", "decode", "--context", "64", "--device", "cpu",
                                 "--out", out, "--json"], capsys)
    assert code == 0, err
    files = json.loads(stdout)["files"]
    assert files["result"] == str(out / "result.json") and sorted(p.name for p in out.iterdir()) == sorted(
        os.path.basename(p) for p in files.values())


def test_eval_ppl_json_has_no_negative_zero_and_no_second_python_field(tmp_path, capsys):
    one_newline = tmp_path / "empty.txt"
    one_newline.write_text("\n")
    code, out, err = run_cli(["eval", "ppl", "--file", one_newline, "--device", "cpu", "--json"], capsys)
    assert code == 0, err
    assert "-0.0" not in out and json.loads(out)["unigram"]["nll"] == 0
    code, out, err = run_cli(["eval", "ppl", "--max-tokens", "32", "--seq-len", "16", "--device", "cpu",
                              "--json"], capsys)
    record = json.loads(out)
    assert code == 0 and "python" not in record and record["env"]["python"] and record["corpus_sha256"]


def test_info_json_peaks_carry_the_compute_ceiling_run_uses(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    code, out, _ = run_cli(["info", "--device", "cpu", "--json"], capsys)
    peaks = json.loads(out)["peaks"]
    assert code == 0 and peaks["compute_rate"] in ("bf16", "fp32") and peaks["compute_tflops"] > 0


RUN = {"schema_version": 1, "kind": "run", "run_id": "r1", "label": None, "profile": "run", "target": "embedded",
       "model": "sala-nano", "completed": 1, "failed": 0}


def test_latency_report_headers_do_not_repeat_the_key_unit_and_csv_booleans_match_markdown(tmp_path):
    records = tmp_path / "r.jsonl"
    records.write_text("\n".join(json.dumps(r) for r in (
        {**RUN, "phase": "prefill", "duration": 0.144, "mean_ttft_ms": 144.0, "floor_s": 0.00168,
         "knobs": {"chat": False}},
        {**RUN, "phase": "decode", "decode_tok_s": 23.4, "floor_s": 0.005, "output_throughput": 20.1,
         "knobs": {"chat": True}})))
    r = salactl("report", "latency", records, "--out", tmp_path / "o", "--format", "md,csv")
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "o" / "report.md").read_text()
    assert "| floor_s |" in md and "| decode_tok_s |" in md and "mean_ttft_ms |" in md
    assert "duration (s)" in md and "output_throughput (tok/s)" in md and "(s) (s)" not in md
    assert "| r1 | false |" in md and "| r1 | true |" in md
    rows = list(csv.DictReader(io.StringIO((tmp_path / "o" / "report.csv").read_text())))
    assert sorted(r["knob.chat"] for r in rows) == ["false", "true"]


def test_a_json_line_without_schema_version_is_not_a_salactl_record(tmp_path):
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"a": 1}\n')
    r = salactl("report", "latency", odd)
    assert r.returncode == 7 and f"error: {odd}:1 is not a salactl record (no schema_version)" in r.stderr


def test_profile_import_of_a_missing_directory_says_so(tmp_path, capsys):
    code, _, err = run_cli(["profile", "--import", tmp_path / "none"], capsys)
    assert code == 2 and f"--import {tmp_path / 'none'} does not exist" in err


def test_bench_option_of_the_other_target_is_named_in_the_singular(tmp_path):
    r = salactl("bench", "--device", "cpu", "--endpoint", "http://127.0.0.1:9", "--out", tmp_path / "o", timeout=60)
    assert r.returncode == 2 and "error: --device configures the embedded runtime, not a server: set it on" in r.stderr


def test_bench_and_sweep_skip_lines_are_notes(tmp_path):
    r = salactl("bench", "--profile", "decode", "--scale", "0.01", "--engine", "reference", "--device", "cpu",
                "--out", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    assert "\nnote: skipping phase decode-bs8: " in "\n" + r.stderr
    r = salactl("sweep", "--device", "cpu", "--window", "48,64", "--block", "16,32", "--input-len", "24",
                "--output-len", "2", "--requests", "1", "--no-kl", "--no-passkey", "--out", tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert "\nnote: skipping invalid point w48-b32: " in "\n" + r.stderr


def _nan_model(tmp_path):
    out = tmp_path / "model"
    shutil.copytree(EMBEDDED_DIR, out)
    shard = out / json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]["lm_head.weight"]
    sd = load_file(shard)
    sd["lm_head.weight"] = sd["lm_head.weight"] * float("nan")
    save_file(sd, shard, metadata={"format": "pt"})
    return out


def test_eval_error_after_a_progress_bar_is_the_only_stderr_line(tmp_path):
    r = salactl("eval", "ppl", "--model", _nan_model(tmp_path), "--device", "cpu", "--max-tokens", "40",
                "--seq-len", "40")
    assert r.returncode == 15 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, repr(r.stderr)
