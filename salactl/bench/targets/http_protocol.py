"""Wire-format parsing of the servers' streams, apart from the HTTP transport (http.py): the
server-sent-events line iterator, and the token counts of SGLang's `/generate` and OpenAI-compatible
`/v1/completions` chunks. Token counts per chunk come from `meta_info.completion_tokens` (/generate)
or per-chunk usage (`stream_options.continuous_usage_stats`, vLLM and SGLang); a chunk whose count
rises times its tokens even when its text is "" (vLLM and SGLang stream special tokens and partial
UTF-8 characters that way). Without per-chunk usage, each choice-0 chunk with a non-empty text is
timed as one token (an empty one, such as a role-only frame or a closing finish_reason chunk,
carries none: TTFT is the first non-empty chunk, as in reference/benchmarks.md); the total then
comes at the end: the last usage the server reported once output began (a final usage chunk; a
role-only first frame's usage of 0 is no count), even below the chunk count, else the streamed text
re-tokenized with the bench tokenizer when there is one (vLLM's client), else the chunk count,
marked as estimated. The runner spreads that total over the timed chunks. Only choice 0 counts, and
an estimate is capped at max_tokens (flagged when it was above).
"""

from __future__ import annotations

import re
import time

from salactl.bench.targets.base import Chunk, RequestFailed

MAX_SSE_LINE = 16 * 2 ** 20              # a longer line is a broken server or proxy, not a token
_LINE_END = re.compile(rb"\r\n|\r|\n")


def iter_sse(read, max_line: int = MAX_SSE_LINE):
    """Yield (data, perf_counter) for each `data:` line of an event stream; `read()` returns the
    next bytes (b"" at the end). Lines end in CRLF, LF or a lone CR (the SSE spec). A line longer
    than `max_line`, or a body without any `data:` line (NDJSON, say), fails the request."""
    pending: list[bytes] = []           # the start of a line whose end has not arrived yet
    pending_len = 0
    after_cr = False                    # the last block ended in CR: a LF opening the next one is its pair
    n_data, n_other, first_other = 0, 0, b""    # other: non-empty lines, neither data nor `: comment`

    def data_of(lines: list[bytes], ts: float):
        nonlocal n_data, n_other, first_other
        for line in lines:
            data = _sse_data(line)
            if data is not None:
                n_data += 1
                yield data, ts
            elif line.strip() and not line.startswith(b":"):
                n_other += 1
                first_other = first_other or line

    while True:
        block = read()
        ts = time.perf_counter()
        if not block:
            yield from data_of([b"".join(pending)], ts)         # the last line may lack its end
            if not n_data and n_other:
                first = first_other[:100].decode("utf-8", "replace")
                raise RequestFailed(f"the response had no SSE data: lines ({n_other} other non-empty "
                                    f"line(s), the first {first!r}); the server does not stream "
                                    "server-sent events: check --endpoint and --backend")
            return
        if after_cr and block.startswith(b"\n"):
            block = block[1:]
        after_cr = block.endswith(b"\r")
        *lines, rest = _LINE_END.split(block)
        if lines:
            lines[0] = b"".join(pending) + lines[0]
            pending, pending_len = [], 0
        yield from data_of(lines, ts)
        pending_len += len(rest)
        if pending_len > max_line:
            raise RequestFailed(f"the server streamed a line longer than {max_line // 2 ** 20} MiB; "
                                "a broken server or proxy")
        if rest:
            pending.append(rest)


def _sse_data(line: bytes) -> str | None:
    line = line.strip()
    if line.startswith(b"data:"):
        return line[5:].strip().decode("utf-8", "replace")
    return None                                 # blank line, `: comment`, event:/id: fields


def sglang_chunks(events, max_tokens: int):
    last, counted = 0, False
    for obj, ts in events:
        if obj is None:
            if not last:
                raise RequestFailed(_no_token("meta_info.completion_tokens stayed 0" if counted else
                                              "no event carried meta_info.completion_tokens"))
            return
        value = _field(obj, "meta_info").get("completion_tokens")
        counted = counted or value is not None
        tokens = _count(last if value is None else value, "meta_info.completion_tokens", max_tokens)
        if tokens > last:
            last = tokens
            yield Chunk(ts, tokens)
    raise _cut_off(last)


def openai_chunks(events, max_tokens: int, estimate):
    """Each choice-0 chunk timestamps the tokens it brings: per-chunk usage counts them whatever
    the text (a special token or part of a UTF-8 character streams as ""), else a chunk with a
    non-empty text brings one. Once chunks were timed without usage, a usage that arrives later
    (llama.cpp closes with it on its choice-0 finish_reason chunk, with or without text) only
    reports the total: its chunk times one token if it has text, none if not, and the total is
    spread over the chunks at the end, so ITL stays per token. A usage-only chunk times nothing.
    The total is the last usage the server reported once output began, even below the chunks
    timed (a role-only first frame's usage of 0 counts nothing); without one, the estimate at the
    end (`estimate(ts, texts, n_chunks, max_tokens)`, the transport's: it holds the tokenizer)."""
    last, by_usage, empty_seen, texts, n_chunks = 0, False, False, [], 0
    reported, usage_any = None, False
    for obj, ts in events:
        if obj is None:
            if reported is None and n_chunks:
                yield estimate(ts, texts, n_chunks, max_tokens)
            elif not (last and reported):
                raise RequestFailed(_why_openai_no_token(bool(n_chunks), empty_seen, usage_any))
            elif reported != last:
                # "usage" names the server as the counter: its total replaces the runner's, even lower
                yield Chunk(ts, reported, counts_only=True, counted_by="usage")
            return
        choice = _choice0(obj)
        counted = _field(obj, "usage").get("completion_tokens")
        text = None if choice is None else choice.get("text")
        has_text = text not in (None, "")
        if has_text:
            n_chunks += 1
            if isinstance(text, str):
                texts.append(text)
        if counted is not None:
            counted = _count(counted, "usage.completion_tokens", max_tokens)
            usage_any = True
            if n_chunks or counted:
                reported = counted
        if choice is None:
            continue
        empty_seen = empty_seen or text == ""
        tokens = counted
        if tokens is None or (last and not by_usage):     # one token per chunk with a non-empty text
            tokens = min(last + 1, max_tokens) if has_text else last
        if tokens > last:
            last, by_usage = tokens, by_usage or counted is not None
            yield Chunk(ts, tokens)
    raise _cut_off(last)


def _choice0(obj: dict) -> dict | None:
    """Choice index 0 (a chunk may carry other choices only; they are not ours)."""
    choices = obj.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise RequestFailed(f"the server streamed choices = {str(choices)[:60]!r}, not a list")
    for choice in choices or []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def _no_token(why: str) -> str:
    return f"the stream ended without any token: {why}"


def _why_openai_no_token(text_seen: bool, empty_seen: bool, usage_seen: bool) -> str:
    if text_seen:               # per-chunk usage stayed 0, or the final usage said 0
        return _no_token("usage.completion_tokens stayed 0 although choices[0].text arrived")
    if empty_seen:
        return _no_token("choices[0].text stayed empty and " + (
            "usage.completion_tokens did not count up with it" if usage_seen else
            "no event carried usage.completion_tokens"))
    if usage_seen:
        return _no_token("usage.completion_tokens counted up but no event had choices[0].text")
    return _no_token("no event carried choices[0].text or usage.completion_tokens")


def _cut_off(last: int) -> RequestFailed:
    return RequestFailed(f"the stream ended after {last} tokens without data: [DONE] "
                         "(the server closed the connection mid-response)")


def _field(obj: dict, key: str) -> dict:
    """obj[key] as a dict ({} when absent or null); anything else fails the request."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestFailed(f"the server streamed {key} = {str(value)[:60]!r}, not an object")
    return value


def _count(value, name: str, max_tokens: int) -> int:
    """A token count from the server: an integer in [0, max_tokens] (a request asks for exactly
    max_tokens with ignore_eos, so more is a server or protocol error, not throughput)."""
    whole = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer())
    if not whole:
        raise RequestFailed(f"the server streamed {name} = {str(value)[:60]!r}, not a token count")
    if not 0 <= value <= max_tokens:
        raise RequestFailed(f"the server streamed {name} = {int(value)} for max_tokens {max_tokens}")
    return int(value)

