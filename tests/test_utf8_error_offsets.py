"""Messages about text that is not UTF-8 say where, all counted the same way: a 0-based offset named
as one ("byte offset N", "character offset N"), as xxd and dd count a file's bytes. The tokenizer
counted from 0 and the lone-surrogate check from 1, both as "character N"."""

from pathlib import Path

import pytest

from salactl.errors import DatasetError, UsageError
from salactl.input_files import lone_surrogate, read_text_option
from salactl.runtime.tokenizer import find_tokenizer


def test_the_tokenizer_names_the_character_offset_of_a_byte_that_is_not_utf8():
    tok = find_tokenizer(None, None)        # the embedded tokenizer
    with pytest.raises(UsageError, match=r"^the text is not valid UTF-8 \(byte 0xff at character offset 2\); "):
        tok.encode("ab\udcffc")


def test_a_lone_surrogate_is_named_at_its_character_offset():
    assert lone_surrogate("bad \udc00 half") == "a lone surrogate (U+DC00 at character offset 4)"
    assert lone_surrogate("\ud83d") == "a lone surrogate (U+D83D at character offset 0)"


def test_a_file_names_the_byte_offset_from_its_start_byte_order_mark_included(tmp_path: Path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfab\n\xff")        # the bad byte is the file's 7th: offset 6, line 2
    with pytest.raises(DatasetError) as e:
        read_text_option(path, "--file")
    assert str(e.value) == f"--file {path}:2 is not UTF-8 text (invalid start byte at byte offset 6); save it as UTF-8"


@pytest.mark.parametrize("data, line, offset", [
    (b"{}\n\xff", 2, 3),                            # counted from the file's start, not the line's
    (b"{}\r\n{}\nab\xff", 3, 9),                    # every line ending's bytes counted, then 2 into the line
    (b"\xef\xbb\xbfa\xff", 1, 4),                   # the byte-order mark dropped before decoding, still counted
    (b"\xef\xbb\xbf{}\n\xe9x", 2, 6),
])
def test_a_records_file_names_the_byte_offset_from_its_start(tmp_path: Path, data, line, offset):
    from salactl.reports.records import record_lines

    path = tmp_path / "records.jsonl"
    path.write_bytes(data)
    with pytest.raises(DatasetError) as e:
        list(record_lines(path))
    assert str(e.value) == (f"{path}:{line} is not UTF-8 text (byte offset {offset}); records files are JSON lines "
                            "written by bench, sweep or run")


def test_report_latency_names_the_byte_offset_of_a_records_file(tmp_path: Path, capsys):
    from conftest import run_cli

    path = tmp_path / "records.jsonl"
    path.write_bytes(b"\n\n\xff")                  # blank lines: no records before the bad byte
    code, out, err = run_cli(["report", "latency", path], capsys)
    assert code == DatasetError.exit_code and out == ""
    assert f"{path}:3 is not UTF-8 text (byte offset 2)" in err, err


@pytest.mark.parametrize("data, offset, reason", [(b"a\xe9", 1, "unexpected end of data"),
                                                  (b"name = 'ok'\n\xff", 12, "invalid start byte")])
def test_a_profile_file_names_the_byte_offset(tmp_path: Path, data, offset, reason):
    from salactl.bench.profiles import load_profile
    from salactl.errors import ConfigError

    path = tmp_path / "p.toml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as e:
        load_profile(str(path))
    assert str(e.value) == (f"--profile {path} is not UTF-8 text ({reason} at byte offset {offset}); "
                            "give a TOML profile file")


def test_bench_names_the_byte_offset_of_a_profile_file(tmp_path: Path, capsys):
    from conftest import run_cli
    from salactl.errors import ConfigError

    path = tmp_path / "p.toml"
    path.write_bytes(b"a\xe9")
    code, out, err = run_cli(["bench", "--profile", path], capsys)
    assert code == ConfigError.exit_code and out == ""
    assert f"--profile {path} is not UTF-8 text (unexpected end of data at byte offset 1)" in err, err
