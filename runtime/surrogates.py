"""Lone surrogates in text: where Python holds bytes that are not UTF-8 (argv from a Latin-1
terminal, a file read with errors="surrogateescape") or JSON escaped half a pair ("\\ud83d").
Half of a surrogate pair is no Unicode character, and no tokenizer can encode it. Torch-free, so
the CLI's input checks can use it without loading the runtime."""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_at(text: str) -> int | None:
    """The character offset of the first lone surrogate in `text`, None where it holds none."""
    m = _SURROGATE.search(text)
    return None if m is None else m.start()
