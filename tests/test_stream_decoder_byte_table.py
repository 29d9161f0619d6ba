"""The stream decoder's GPT-2 byte table (a ByteLevel piece's characters -> its bytes) against the
`tokenizers` ByteLevel decoder itself: every byte once, ASCII as itself, and every two-byte UTF-8
character from the characters of its lead and continuation bytes."""

from tokenizers import decoders

from salactl.runtime.stream_decoder import _bytes_to_unicode


def test_the_byte_table_inverts_the_bytelevel_decoder():
    byte_of = _bytes_to_unicode()
    assert sorted(byte_of.values()) == list(range(256))
    char_of = {b: c for c, b in byte_of.items()}
    dec = decoders.ByteLevel()
    assert [dec.decode([char_of[b]]) for b in range(128)] == [chr(b) for b in range(128)]
    for lead in range(0xC2, 0xE0):
        pieces = [char_of[lead] + char_of[cont] for cont in range(0x80, 0xC0)]
        assert [dec.decode([p]) for p in pieces] == [bytes([lead, c]).decode() for c in range(0x80, 0xC0)], hex(lead)
