"""Messages about text that is not UTF-8 say where, all counted the same way: a 0-based offset named
as one ("byte offset N", "character offset N"), as xxd and dd count a file's bytes. The tokenizer
counted from 0 and the lone-surrogate check from 1, both as "character N"."""

from pathlib import Path

import pytest

from salactl.errors import DatasetError, UsageError
from salactl.output import lone_surrogate, read_text_option
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
