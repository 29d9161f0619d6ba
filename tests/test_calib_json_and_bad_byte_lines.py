"""A --calib file that is JSON but not named .jsonl (an array of {"text": ...} objects, JSONL saved as
.json or .txt) is refused (exit 7) rather than calibrated on as its markup, while plain text that
starts with "{" or "[" is still text; a byte that is not UTF-8 in an input file is reported by file:line."""

import json

import pytest

from conftest import run_cli
from salactl.errors import DatasetError
from salactl.input_files import read_text_option
from salactl.quant.calibration import read_documents

DOCS = ["The first calibration document.", "And a second one."]
REFUSED = ("looks like JSON, which would be calibrated on as plain text with its markup; save it as JSONL "
           "with a .jsonl suffix (one {\"text\": ...} object per line), or pass plain text")


@pytest.mark.parametrize("name, content", [
    ("arr.json", json.dumps([{"text": d} for d in DOCS], indent=2)),
    ("obj.txt", "\n" + json.dumps({"docs": DOCS})),
    ("lines.json", "".join(json.dumps({"text": d}) + "\n" for d in DOCS)),
    ("lines.txt", "\n  " + json.dumps({"text": DOCS[0], "n": 1.5}) + "\r\nnot json at all\n"),
    ("mac.txt", "".join(json.dumps({"text": d}) + "\r" for d in DOCS) + "prose\r"),   # CR-only line ends
])
def test_json_calib_without_the_jsonl_suffix_is_refused(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DatasetError) as e:
        read_documents(path)
    assert str(e.value) == f"--calib {path} {REFUSED}"


@pytest.mark.parametrize("content", [
    "{\n  int x = 1;\n}\n",                                  # source code
    "[1] A citation, then prose.\n",
    '{"text": "one line of JSON"} followed by prose\n',      # the first line does not parse
    '{"title": "a JSON line without text"}\nmore prose\n',
    '"a JSON string"\n',
    "[" * 100_000,                                          # nests past the parser's recursion limit
    '[{"role": "user"}] is how a chat list starts\n',       # an array's first object without "text"
])
def test_text_that_only_starts_like_json_is_still_text(tmp_path, content):
    path = tmp_path / "c.txt"
    path.write_text(content)
    assert read_documents(path) == [content]


def test_past_the_whole_parse_limit_an_array_is_judged_by_its_first_element(tmp_path, monkeypatch):
    """Parsing a big file whole would take many times its size in memory (every string is built),
    past what the --calib size check allows; its first element still tells an array of documents."""
    import salactl.quant.calibration as calibration

    docs, words = tmp_path / "docs.json", tmp_path / "words.json"
    docs.write_text(json.dumps([{"text": d} for d in DOCS] * 50))
    words.write_text(json.dumps(DOCS * 50))
    monkeypatch.setattr(calibration, "WHOLE_JSON_CHARS", 64)
    with pytest.raises(DatasetError, match="looks like JSON"):
        read_documents(docs)
    assert read_documents(words) == [words.read_text()]          # past the limit: read as text
    monkeypatch.setattr(calibration, "WHOLE_JSON_CHARS", 1 << 20)
    with pytest.raises(DatasetError, match="looks like JSON"):
        read_documents(words)


def test_quantize_refuses_a_json_array_calib_before_writing(tmp_path, capsys):
    (tmp_path / "arr.json").write_text(json.dumps([{"text": d * 20} for d in DOCS]))
    code, out, err = run_cli(["quantize", "--out", tmp_path / "q", "--method", "rtn", "--nsamples", "1",
                              "--seqlen", "16", "--calib", tmp_path / "arr.json"], capsys)
    assert code == 7 and err.splitlines() == [f"error: --calib {tmp_path / 'arr.json'} {REFUSED}"], err
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("data, line", [(b"caf\xe9", 1), (b"one\ntwo\r\nthree\rcaf\xe9\n", 4),
                                        (b"\n\n\xff", 3)])
def test_a_byte_that_is_not_utf8_is_reported_by_line(tmp_path, data, line):
    path = tmp_path / "p.txt"
    path.write_bytes(data)
    with pytest.raises(DatasetError, match=rf"^--prompt-file {path}:{line} is not UTF-8 text \(.* at byte offset "
                                           rf"{data.index(next(b for b in data if b >= 0x80).to_bytes(1, 'big'))}\)"):
        read_text_option(path, "--prompt-file")
