"""What a finished phase's requests say about its numbers: failures, answers shorter than asked,
token counts the client had to estimate (or cap at max_tokens). Each gets one stderr line per phase; failures and short
answers (when the requests asked for a fixed length) also keep the phase out of the SOAR score,
since its duration then measures less than the workload."""

from __future__ import annotations

from collections import Counter

from salactl import output
from salactl.bench.requests import RequestResult


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else "no tokens"


def all_failed(phase: str, results: list[RequestResult]) -> str | None:
    """Why a phase in which no request succeeded measured nothing, or None."""
    if not results or any(r.success for r in results):
        return None
    errors = Counter(first_line(r.error) for r in results)
    (first, n), = errors.most_common(1)
    return f"phase {phase}: all {len(results)} requests failed ({n}x: {first})"


def warn_failures(phase: str, results: list[RequestResult], details: bool) -> None:
    """One line for a phase in which some (not all: check_all_failed says that) requests failed."""
    if not any(r.success for r in results):
        return
    errors = Counter(first_line(r.error) for r in results if not r.success)
    if errors:
        (first, n), = errors.most_common(1)
        more = f" and {len(errors) - 1} other errors" if len(errors) > 1 else ""
        output.warn_once(f"phase {phase}: {sum(errors.values())} of {len(results)} requests failed "
                         f"({n}x: {first}{more})" + ("" if details else "; --details writes each request's error"))


def warn_short(phase: str, results: list[RequestResult]) -> None:
    """Every target asks for exactly max_tokens (ignore_eos): a shorter answer is the server's doing."""
    short = [r for r in results if r.short]
    if short:
        r = short[0]
        by, cause = "", "the server ignored ignore_eos/max_tokens or hit its context limit"
        if r.output_len_estimated:
            by = " by re-tokenizing the streamed text"
            cause += " (or its text re-tokenizes to fewer tokens: a server that streams usage gives exact counts)"
        output.warn_once(f"phase {phase}: {len(short)} of {len(results)} requests returned fewer tokens "
                         f"than requested (e.g. {r.output_len} of {r.expected_output_len}{by}); {cause}")


def warn_estimated(phase: str, results: list[RequestResult]) -> None:
    by = Counter(r.output_len_source for r in results if r.success and r.output_len_estimated)
    if not by:
        return
    how = ("counted by re-tokenizing the streamed text with the bench tokenizer" if "chunks" not in by else
           "counted as one per streamed chunk, an undercount when chunks carry several tokens (pass "
           "--tokenizer for a closer count)")
    output.warn_once(f"phase {phase}: the server reported no token usage for {sum(by.values())} of {len(results)} "
                     f"requests; their output tokens were {how}")


def warn_over_max(phase: str, results: list[RequestResult]) -> None:
    """An estimate above max_tokens: the server streamed more than asked (extra choices, or text
    that re-tokenizes differently); the count was capped, which this line says."""
    over = [r for r in results if r.success and r.output_len_over_max is not None]
    if over:
        r = over[0]
        output.warn_once(f"phase {phase}: {len(over)} of {len(results)} requests streamed more than max_tokens "
                         f"by the client's estimate (e.g. {r.output_len_over_max} {r.output_len_source} count for "
                         f"{r.expected_output_len} asked); their counts were capped at max_tokens")


def count_fields(results: list[RequestResult]) -> dict:
    """How the phase's output tokens were counted, for its record: `output_len_source` lists the
    sources of the successful requests (usage, engine, tokenizer, chunks; "+" when mixed)."""
    ok = [r for r in results if r.success]
    sources = sorted({r.output_len_source for r in ok})
    return {"output_len_source": "+".join(sources) or None,
            "output_len_over_max": sum(r.output_len_over_max is not None for r in ok)}


def score_problem(results: list[RequestResult]) -> str | None:
    """Why this phase's duration cannot be scored, or None."""
    failed = sum(not r.success for r in results)
    short = sum(r.short for r in results)
    parts = []
    if failed:
        parts.append(f"{failed} of {len(results)} requests failed")
    if short:
        parts.append(f"{short} of {len(results)} requests returned fewer tokens than requested")
    return ", ".join(parts) or None
