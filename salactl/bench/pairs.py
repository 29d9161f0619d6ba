"""`KEY=NUMBER,KEY=NUMBER` option values (--slo, --reference)."""

from __future__ import annotations

import math

from salactl.errors import UsageError


def parse_positive_pairs(text: str | None, option: str, unit: str, example: str,
                         keys: tuple[str, ...] | None = None) -> dict[str, float]:
    if text is None:
        return {}
    if not text.strip():
        raise UsageError(f"{option} is empty; give pairs such as {example}, or leave {option} out")
    out = {}
    for part in text.split(","):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep or not key or (keys is not None and key not in keys):
            what = "/".join(keys) if keys else "NAME"
            raise UsageError(f"{option} takes {what}={unit.upper()} pairs, e.g. {example}; got {part!r}")
        if key in out:
            raise UsageError(f"{option} gives {key} twice ({out[key]:g} and {val.strip()}); give each name once")
        try:
            num = float(val)
        except ValueError:
            raise UsageError(f"{option} {key} must be a number of {unit}, got {val!r}") from None
        if not num > 0 or math.isinf(num):
            raise UsageError(f"{option} {key} must be a positive number of {unit}, got {val}")
        out[key] = num
    return out
