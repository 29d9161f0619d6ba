"""`salactl report`'s comma-list options as every other command's: an empty item ("bf16,", "md,,csv")
is a usage error naming the option (docs/reference.md "Empty paths"), not dropped in silence, and a
repeated value counts once (--context rows, a --format that names one format twice goes to stdout)."""

import json

import pytest

from conftest import run_cli

RECORD = {"schema_version": 1, "kind": "bench", "run_id": "r-1", "label": "a", "profile": "decode", "phase": "S1",
          "target": "embedded", "model": "sala-nano", "completed": 3, "failed": 0, "mean_ttft_ms": 10.0,
          "knobs": {"max_concurrency": 1}, "env": {}}


@pytest.mark.parametrize("flag, text", [("--kv-cache-dtype", "bf16,"), ("--kv-cache-dtype", "bf16,,fp8_e4m3"),
                                        ("--kv-cache-dtype", ",bf16"), ("--weights", "bf16,"),
                                        ("--gpu", "H100, ")])
def test_report_memory_refuses_an_empty_list_item(capsys, flag, text):
    code, out, err = run_cli(["report", "memory", "--model", "sala-9b", flag, text, "--json"], capsys)
    assert (code, out) == (2, "")
    assert err == f"error: {flag} takes comma-separated names, got {text!r}; drop the empty name\n"


@pytest.mark.parametrize("text", ["md,", "md,,csv"])
def test_report_latency_refuses_an_empty_format(tmp_path, capsys, text):
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps(RECORD) + "\n")
    code, out, err = run_cli(["report", "latency", records, "--out", tmp_path / "rep", "--format", text], capsys)
    assert (code, out) == (2, "")
    assert err == f"error: --format takes comma-separated names, got {text!r}; drop the empty name\n"
    assert not (tmp_path / "rep").exists()


def test_a_repeated_format_is_one_format_on_stdout(tmp_path, capsys):
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps(RECORD) + "\n")
    code, out, err = run_cli(["report", "latency", records, "--format", "md,md"], capsys)
    assert code == 0, err
    assert out.startswith("# Latency report\n")


def test_a_repeated_context_is_one_row(capsys):
    code, out, err = run_cli(["report", "memory", "--model", "sala-9b", "--context", "4096,4096,8192",
                              "--kv-cache-dtype", "bf16", "--weights", "bf16", "--gpu", "H100", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert [r["context"] for r in report["per_request"]] == [4096, 8192]
    assert [r["context"] for r in report["concurrency"]] == [4096, 8192]
