"""Which points already recorded under --out `salactl sweep --resume` can reuse rather than measure
again: a record is reused only when `salactl report` would accept it (validated as the resumed phase)
and it carries what the sweep reads of it (the RESUME_KNOBS and the passkey rows' lengths); any other
record's point is measured again, with the reason it could not be reused."""

from __future__ import annotations

from salactl.errors import DatasetError
from salactl.reports.records import validate as validate_record
from salactl.runtime.sampling import is_int


# what a recorded point needs to be reused: the knobs and fields the notes and the front read
RESUME_KNOBS = ("dense_len", "input_len", "output_len")


def reusable(records: list[dict]) -> tuple[dict[str, dict], dict[str, str]]:
    """({point_key: record} of the points --resume can reuse, {point_key: why not} of those whose
    record `salactl report` would refuse (another schema_version, say) or lacks what the sweep reads
    of it (a hand-edited or foreign line): measured again)."""
    done, unusable = {}, {}
    for r in records:
        key = r.get("point_key")
        if isinstance(key, str):
            why = _why_not_reusable(r)
            if why:
                unusable[key] = why
            else:
                done[key] = r
    return done, unusable


def _why_not_reusable(r: dict) -> str | None:
    """Why `r` cannot be reused (a clause after "the record"), or None."""
    try:      # resume renames the point, so the phase it was recorded under is never read
        validate_record(dict(r, phase="resumed"), "it")
    except DatasetError as e:
        return f"is not one this salactl reads ({e})"
    missing = _missing_fields(r)
    return f"lacks {missing}" if missing else None


def _missing_fields(r: dict) -> str | None:
    knobs = r.get("knobs")
    if not isinstance(knobs, dict):
        return "knobs"
    for k in RESUME_KNOBS:
        if not is_int(knobs.get(k)):
            return f"knobs.{k} (an integer)"
    rows = r.get("passkey_results")
    if rows is not None and not (isinstance(rows, list) and all(isinstance(x, dict) and is_int(x.get("length"))
                                                                for x in rows)):
        return "passkey_results[].length (an integer)"
    return None
