"""Paths given on the command line under an ASCII locale with UTF-8 mode off (PYTHONUTF8=0 LC_ALL=C):
the --json output and the records written name them as UTF-8, as under a UTF-8 locale, never as
lone surrogates ("\\udcc3\\udca8") that no UTF-8 file can hold; and a model in such a directory
loads (its tokenizer too: the `tokenizers` library takes only a UTF-8 path, so salactl hands it the
file's text)."""

import json
import os
import sys

import pytest

from salactl.errors import TokenizerError
from salactl.runtime.tokenizer import Tokenizer
from test_run_argv_utf8_under_c_locale import run_in_c_locale

pytestmark = pytest.mark.skipif(sys.platform != "linux" or sys.getfilesystemencoding() != "utf-8",
                                reason="compares a POSIX ASCII locale with this process's UTF-8 one")

NANO = os.path.join(os.path.dirname(__file__), "..", "runtime", "models", "sala-nano")


@pytest.fixture
def model_dir(tmp_path):
    """sala-nano's checkpoint under a directory named "modèle"."""
    d = tmp_path / "modèle"
    d.mkdir()
    for name in os.listdir(NANO):
        os.symlink(os.path.abspath(os.path.join(NANO, name)), d / name)
    return d


def _ok(r) -> dict:
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")[-2000:]
    assert b"\\udc" not in r.stdout
    return json.loads(r.stdout)


def _records(path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert "\\udc" not in text
    return [json.loads(line) for line in text.splitlines()]


def test_run_eval_and_report_name_utf8_paths(tmp_path, model_dir):
    out = tmp_path / "sortie é"
    result = _ok(run_in_c_locale(["--model", str(model_dir), "--prompt-ids", "1,2,3", "-n", "2",
                                  "--no-op-profile", "--device", "cpu", "--json", "-o", str(out)]))
    assert result["model"] == str(model_dir)
    records = _records(out / "records.jsonl")
    assert {r["model"] for r in records} == {r["knobs"]["model"] for r in records} == {str(model_dir)}

    text = tmp_path / "tèxte.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    ppl = _ok(run_in_c_locale(["ppl", "--model", str(model_dir), "--file", str(text), "--seq-len", "32",
                               "--max-tokens", "64", "--device", "cpu", "--json"], b"eval"))
    assert ppl["model"] == str(model_dir) and ppl["file"] == str(text)

    report = _ok(run_in_c_locale(["latency", str(out / "records.jsonl"), "-o", str(tmp_path / "rapport é"),
                                  "--format", "csv", "--json"], b"report"))
    assert report["files"] == [str(tmp_path / "rapport é" / "report.csv")]


def test_bench_names_utf8_paths(tmp_path, model_dir):
    out = tmp_path / "sortie é"
    result = _ok(run_in_c_locale(["--model", str(model_dir), "--device", "cpu", "--num-requests", "1",
                                  "--phases", "S1", "--scale", "0.01", "--details", "-o", str(out), "--json"],
                                 b"bench"))
    assert result["model"] == str(model_dir)
    assert result["files"]["records"] == str(out / "records.jsonl")
    assert all(str(out) in p for p in [*result["files"]["plots"], result["files"]["summary_json"]])
    records = _records(out / "records.jsonl")
    assert {r["model"] for r in records} == {str(model_dir)}
    assert {r["details_csv"] for r in records} == {str(out / f"{result['run_id']}-requests.csv")}
    summary = json.loads((out / f"{result['run_id']}.json").read_text(encoding="utf-8"))
    assert summary["model"] == str(model_dir) and summary["files"]["records"] == str(out / "records.jsonl")


@pytest.mark.parametrize("chat", [[], ["--chat"]], ids=["plain", "chat-template"])
def test_run_loads_the_tokenizer_of_a_non_ascii_model_directory(model_dir, chat):
    result = _ok(run_in_c_locale(["--model", str(model_dir), "--device", "cpu", "--prompt", "hi",
                                  "--max-new-tokens", "2", "--no-op-profile", "--json", *chat]))
    assert result["model"] == str(model_dir) and len(result["output_token_ids"]) == 2


def test_quantize_json_names_out_and_model_as_utf8(tmp_path, model_dir):
    out = tmp_path / "sortie é"
    result = _ok(run_in_c_locale(["--model", str(model_dir), "--method", "rtn", "--device", "cpu",
                                  "--out", str(out), "--json"], b"quantize"))
    assert result["out"] == str(out) and result["model"] == str(model_dir)
    assert (out / "config.json").is_file()


def test_a_tokenizer_json_that_is_not_utf8_names_the_byte(tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(b'{"version": "1.0", "x": "\xe9"}')
    with pytest.raises(TokenizerError) as e:
        Tokenizer(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'tokenizer.json'} is not a valid tokenizer.json (not UTF-8: byte 0xe9 "
                            "at offset 25); re-download the model's tokenizer.json or pass another --tokenizer")
