"""Comma-separated list options (`--lengths 256,512`, `--topk 2,4`): one parser, one wording."""

from __future__ import annotations

from salactl.errors import UsageError

_WHAT = {int: "integers", float: "numbers", str: "names"}
_ONE = {int: "value", float: "value", str: "name"}


def parse_list(text: str, flag: str, kind=int, minimum: float | None = None, dedupe: bool = False) -> list:
    """The values of `text` ("1, 2,3") as `kind`; a usage error naming `flag` for an empty list, an
    empty item, a value that is not a `kind`, or one below `minimum`. `dedupe` drops repeats
    (keeping the first)."""
    items = str(text).replace(" ", "").split(",")
    if not any(items):                  # "" or ","
        raise UsageError(f"{flag} is empty")
    if "" in items:
        raise UsageError(f"{flag} takes comma-separated {_WHAT[kind]}, got {text!r}; drop the empty {_ONE[kind]}")
    try:
        values = [kind(x) for x in items]
    except ValueError:
        plain = "; write whole numbers without units (131072, not 128k)" if kind is int else ""
        raise UsageError(f"{flag} takes comma-separated {_WHAT[kind]}, got {text!r}{plain}") from None
    bad = [v for v in values if minimum is not None and v < minimum]
    if bad:
        bound = "positive" if minimum == 1 and kind is int else f">= {minimum}"
        raise UsageError(f"{flag} values must be {bound}, got {bad[0]}")
    return list(dict.fromkeys(values)) if dedupe else values
