"""bench --dataset and quantize --calib inputs that used to crash, hang or mislead: rows nested too
deeply or holding huge integers, U+2028 inside strings, lone surrogates, devices and FIFOs, files and
single prompts too big for the host's memory; rows tokenized once for every phase, the record's
count of skipped rows, and the warning past max_position_embeddings."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench_tokenizer import make_tokenizer
from salactl.bench.datasets import FIRST_BAD_LINES, SoarRow, read_soar_rows, soar_requests
from salactl.errors import CapacityError, DatasetError
from salactl.input_files import TOKENIZER_BYTES_PER_BYTE
from salactl.runtime.loader import EMBEDDED_DIR, available_host_bytes
from salactl.runtime.tokenizer import Tokenizer

GOOD = {"question": "the quick brown fox jumps", "model_response": "over the lazy dog again"}
DEEP = '{"question": ' + "[" * 100_000 + "]" * 100_000 + ', "model_response": "a b"}'
BIGINT = '{"question": "a b c", "model_response": "d e f", "n": ' + "9" * 5000 + "}"
SURROGATE = '{"question": "ok prompt", "model_response": "bad \\ud83d tail"}'


def salactl(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def embedded(*args, timeout=300):
    return salactl("bench", "--model", "sala-nano", "--random-weights", "--device", "cpu", "--dtype", "float32",
                   *args, timeout=timeout)


def one_line(r, code, *words):
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert all(w in r.stderr for w in words), r.stderr


def write(path: Path, lines) -> Path:
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("row, why", [
    (DEEP, "nests JSON arrays/objects too deeply to parse"),
    (BIGINT, "holds an integer with too many digits to parse"),
    (SURROGATE, "field 'model_response' holds a lone surrogate (U+D83D at character offset 4)"),
])
def test_rows_json_or_unicode_cannot_hold_are_bad_rows(tmp_path, row, why):
    f = write(tmp_path / "d.jsonl", [json.dumps(GOOD), row, json.dumps(GOOD)])
    with pytest.raises(DatasetError, match=rf"d.jsonl:2: row .*; fix the row or pass --skip-bad-rows") as e:
        read_soar_rows(f)
    assert why in str(e.value)
    rows, report = read_soar_rows(f, skip_bad_rows=True)
    assert [r.line for r in rows] == [1, 3] and report.bad_rows == 1 and report.bad_lines == (2,)


def test_bad_rows_stop_bench_before_the_model_loads_and_skip_with_a_count(tmp_path):
    """Exit 7 naming FILE:LINE without --skip-bad-rows; with it the run goes on, and each phase's
    record keeps the count and the first lines only (it held every line number, in every phase)."""
    bad = [DEEP, BIGINT, SURROGATE] * 4                 # 12 bad rows, lines 2..13
    data = write(tmp_path / "d.jsonl", [json.dumps(GOOD), *bad, json.dumps(GOOD)])
    out = tmp_path / "runs"
    r = embedded("--dataset", str(data), "--out", str(out), "--phases", "S1", "--num-requests", "1")
    one_line(r, 7, f"{data}:2: row nests JSON arrays/objects too deeply")
    assert not out.exists()
    r = embedded("--dataset", str(data), "--skip-bad-rows", "--out", str(out), "--phases", "S1,S8",
                 "--num-requests", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert f"skipped 12 malformed rows of {data} (lines 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ...)" in r.stderr
    for rec in map(json.loads, (out / "records.jsonl").read_text().splitlines()):
        ds = rec["knobs"]["dataset"]
        assert ds["bad_rows_skipped"] == 12 and ds["bad_rows_first_lines"] == list(range(2, 2 + FIRST_BAD_LINES))


def test_lines_end_at_newline_only(tmp_path):
    """U+2028/U+2029/U+0085 are text inside a JSON string (json.dumps(ensure_ascii=False) leaves them
    raw); str.splitlines() cut such rows in two. CRLF files still parse."""
    prompts = ["para one\u2028para two", "one\u2029two", "next\x85line"]
    data = tmp_path / "d.jsonl"
    data.write_bytes("".join(json.dumps({"question": p, "model_response": "a b c"}, ensure_ascii=False) + "\r\n"
                             for p in prompts).encode("utf-8"))
    rows, report = read_soar_rows(data)
    assert [r.prompt for r in rows] == prompts and [r.line for r in rows] == [1, 2, 3]
    assert report.bad_rows == 0


def test_unterminated_string_message_says_at_once(tmp_path):
    f = write(tmp_path / "d.jsonl", ['{"question": "never closed'])
    with pytest.raises(DatasetError, match=r"d.jsonl:1: row is not valid JSON \(Unterminated string starting "
                                           r"at column 14\)"):
        read_soar_rows(f)


@pytest.mark.parametrize("which", ["dev-zero", "fifo", "directory"])
def test_a_dataset_that_is_no_regular_file_is_refused_at_once(tmp_path, which):
    path = {"dev-zero": Path("/dev/zero"), "fifo": tmp_path / "fifo", "directory": tmp_path}[which]
    if which == "fifo":
        os.mkfifo(path)
    if not path.exists():
        pytest.skip("no /dev/zero here")
    r = embedded("--dataset", str(path), "--out", str(tmp_path / "o"), timeout=60)
    one_line(r, 7, f"dataset {path} is not a regular file")


def sparse_file(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_a_dataset_bigger_than_memory_is_refused_before_reading(tmp_path):
    avail = available_host_bytes()
    if avail is None:
        pytest.skip("available host memory unknown")
    data = sparse_file(tmp_path / "big.jsonl", avail // 8)       # 16 bytes held per byte: twice what is there
    r = embedded("--dataset", str(data), "--out", str(tmp_path / "o"), timeout=60)
    one_line(r, 11, f"reading dataset {data}", "but this machine has", "give a smaller file (up to about")


def test_rows_are_tokenized_once_for_every_phase(tmp_path):
    from salactl.bench.plan import parse_dataset_spec, plan_phases, read_datasets
    from salactl.bench.profiles import load_profile

    tok = Tokenizer(make_tokenizer(tmp_path / "tok"))
    data = write(tmp_path / "d.jsonl", [json.dumps({"question": f"prompt number {i} " * (i + 2),
                                                    "model_response": "some words back " * (i + 1)})
                                        for i in range(5)])
    soar = load_profile("soar")
    spec = parse_dataset_spec(str(data), [p.name for p in soar.phases])
    parsed = read_datasets(spec, list(soar.phases), False)
    plans = plan_phases(soar, list(soar.phases), spec, parsed, tok, tok.vocab_size, None, None)
    by_line = [{r.source_line: r.prompt_ids for r in p.requests} for p in plans]
    assert all(len(x) == 5 for x in by_line)
    # the same tuple object in every phase: one encode per row, one copy of its ids in memory
    assert all(by_line[0][line] is other[line] for other in by_line[1:] for line in by_line[0])


def too_long_for_the_tokenizer() -> int:
    avail = available_host_bytes()
    if avail is None:
        pytest.skip("available host memory unknown")
    n = 2 * avail // TOKENIZER_BYTES_PER_BYTE
    if n > 200 * 2**20:
        pytest.skip("this host's memory would need a prompt over 200 MB")
    return n


def test_a_prompt_the_tokenizer_cannot_hold_is_refused_before_encoding(tmp_path):
    """The tokenizers library aborts the process (rc 134) when an allocation fails: a prompt whose
    encoding cannot fit in the host's memory is exit 11 naming its row, before encode is called."""
    n = too_long_for_the_tokenizer()
    tok = Tokenizer(make_tokenizer(tmp_path / "tok"))
    rows = [SoarRow(1, "short prompt here", "a b c"), SoarRow(7, "a" * n, "a b c")]
    with pytest.raises(CapacityError, match=rf"tokenizing the prompt of {tmp_path}/d.jsonl:7 \({n:,} bytes "
                                            r"of UTF-8\) needs .*; shorten or drop the row \(about .* fit\)"):
        soar_requests(rows, tok, path=tmp_path / "d.jsonl")


def test_a_calibration_document_the_tokenizer_cannot_hold_is_refused(tmp_path):
    from salactl.quant.calibration import calibration_windows

    n = too_long_for_the_tokenizer()
    calib = tmp_path / "calib.txt"
    calib.write_bytes(b"a" * n)
    tok = Tokenizer(make_tokenizer(tmp_path / "tok"))
    with pytest.raises(CapacityError, match=rf"tokenizing a document of {calib} .*split it into smaller documents"):
        calibration_windows(str(calib), tok, 2, 8, tok.vocab_size)


@pytest.mark.parametrize("row, why", [
    (DEEP.replace('"question"', '"text"'), "nests JSON arrays/objects too deeply to parse"),
    ('{"text": "a b", "n": ' + "9" * 5000 + "}", "holds an integer with too many digits to parse"),
    ('{"text": "bad \\udc00 half"}', "has a lone surrogate (U+DC00 at character offset 4)"),
    ('{"text": "never closed', "is not valid JSON (Unterminated string starting at column 10)"),
])
def test_calibration_jsonl_rows_are_one_line_dataset_errors(tmp_path, row, why):
    from salactl.quant.calibration import read_documents

    f = write(tmp_path / "c.jsonl", ['{"text": "fine"}', row])
    with pytest.raises(DatasetError) as e:
        read_documents(f)
    assert str(e.value).startswith(f"{f}:2 ") and why in str(e.value) and "\n" not in str(e.value)


def test_calibration_jsonl_keeps_u2028_inside_a_document(tmp_path):
    from salactl.quant.calibration import read_documents

    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "one\u2028two\x85three"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_documents(f) == ["one\u2028two\x85three"]


def test_calibration_file_that_is_no_regular_file_is_refused(tmp_path):
    from salactl.quant.calibration import read_documents

    fifo = tmp_path / "calib.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DatasetError, match=f"--calib {fifo} is not a regular file; give a text or JSONL file"):
        read_documents(fifo)


def test_bench_warns_once_past_the_trained_length(tmp_path):
    """run warns past max_position_embeddings and the CLI silences the engine's own warning, so
    bench says it for its longest request (prompt plus output), naming the row."""
    model = Path(shutil.copytree(EMBEDDED_DIR, tmp_path / "nano-max-pos-16", copy_function=os.symlink))
    config = {**json.loads((EMBEDDED_DIR / "config.json").read_text()), "max_position_embeddings": 16}
    (model / "config.json").unlink()
    (model / "config.json").write_text(json.dumps(config))
    data = write(tmp_path / "d.jsonl", [json.dumps({"question": "a b", "model_response": "c d"}),
                                        json.dumps({"question": "word " * 20, "model_response": "more words"})])
    r = salactl("bench", "--model", str(model), "--device", "cpu", "--dataset", str(data), "--phases", "S1,S8",
                "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    warnings = [x for x in r.stderr.splitlines() if "max_position_embeddings" in x]
    assert len(warnings) == 1, r.stderr
    assert warnings[0].startswith(f"warning: the longest request ({data}:2, input plus output) is ")
    assert "past the model's max_position_embeddings (16)" in warnings[0]


def test_dataset_help_says_every_row_runs_in_each_phase():
    r = salactl("bench", "--help", timeout=60)
    text = " ".join(r.stdout.split())
    assert "Every row runs in each phase, as SOAR's script passes --num-prompts = the file's rows" in text
