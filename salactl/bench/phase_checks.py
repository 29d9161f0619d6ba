"""What a finished phase's requests say about its numbers: failures, answers shorter than asked,
token counts the client had to estimate. Each gets one stderr line per phase; failures and short
answers (when the requests asked for a fixed length) also keep the phase out of the SOAR score,
since its duration then measures less than the workload."""

from __future__ import annotations

from collections import Counter

from salactl import output
from salactl.bench.requests import RequestResult
from salactl.errors import EndpointError


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else "no tokens"


def check_all_failed(phase: str, results: list[RequestResult], records_path) -> None:
    """A phase in which no request succeeded measured nothing: stop with an endpoint error."""
    if results and not any(r.success for r in results):
        errors = Counter(first_line(r.error) for r in results)
        (first, n), = errors.most_common(1)
        raise EndpointError(f"phase {phase}: all {len(results)} requests failed ({n}x: {first}); "
                            f"records so far are in {records_path}")


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
        output.warn_once(f"phase {phase}: {len(short)} of {len(results)} requests returned fewer tokens "
                         f"than requested (e.g. {r.output_len} of {r.expected_output_len}); the server "
                         "ignored ignore_eos/max_tokens or hit its context limit")


def warn_estimated(phase: str, results: list[RequestResult], has_tokenizer: bool) -> None:
    n = sum(r.output_len_estimated for r in results if r.success)
    if not n:
        return
    how = ("counted by re-tokenizing the streamed text with the bench tokenizer" if has_tokenizer else
           "counted as one per streamed chunk, an undercount when chunks carry several tokens (pass "
           "--tokenizer for a closer count)")
    output.warn_once(f"phase {phase}: the server reported no token usage for {n} of {len(results)} "
                     f"requests; their output tokens were {how}")


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
