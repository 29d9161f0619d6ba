"""Edges of the servers' wire format (salactl.bench.targets.http_protocol), fed directly: the SSE
line iterator's other fields and limits, and which SGLang / OpenAI chunks time tokens."""

import re

import pytest

from salactl.bench.targets.base import Chunk, RequestFailed
from salactl.bench.targets.http_protocol import iter_sse, openai_chunks, sglang_chunks


def _reader(blocks):
    it = iter([*blocks, b""])
    return lambda: next(it)


def _data(blocks, **kw):
    return [d for d, _ in iter_sse(_reader(blocks), **kw)]


def _no_estimate(*args):
    raise AssertionError("no estimate expected")


def test_event_and_id_fields_beside_data_lines_are_no_failure():
    """Only a body with no `data:` line at all is refused; `event:`/`id:` fields of a real SSE
    stream sit beside its data lines."""
    got = _data([b"event: message\nid: 1\ndata: a\n\n", b"retry: 10\ndata: b\n\n"])
    assert got == ["a", "b"]


def test_an_empty_body_or_comments_only_yields_nothing_without_failing():
    assert _data([]) == []
    assert _data([b": keep-alive\n\n", b":\n"]) == []


def test_a_body_without_data_lines_fails_naming_its_first_line():
    why = "no SSE data: lines (2 other non-empty line(s), the first '{\"a\": 1}')"
    with pytest.raises(RequestFailed, match=re.escape(why)):
        _data([b'{"a": 1}\n{"b": 2}\n'])


def test_a_line_past_the_limit_fails_as_a_broken_server_or_proxy():
    with pytest.raises(RequestFailed, match=r"longer than 1 MiB; a broken server or proxy$"):
        _data([b"data: " + b"x" * 2 ** 20], max_line=2 ** 20)


def test_sglang_a_count_that_does_not_rise_times_nothing():
    """A first event that reports 0 tokens, and a repeated count, are no token arrivals: TTFT is the
    first event whose count rises."""
    events = [({"meta_info": {"completion_tokens": 0}}, 1.0), ({"meta_info": {"completion_tokens": 2}}, 2.0),
              ({"meta_info": {"completion_tokens": 2}}, 3.0), ({"meta_info": {}}, 4.0),
              ({"meta_info": {"completion_tokens": 3}}, 5.0), (None, 6.0)]
    assert list(sglang_chunks(iter(events), 4)) == [Chunk(2.0, 2), Chunk(5.0, 3)]


def test_openai_a_stream_without_any_choice_or_usage_says_so():
    with pytest.raises(RequestFailed, match=r"without any token: no event carried choices\[0\]\.text or "
                                            r"usage\.completion_tokens$"):
        list(openai_chunks(iter([({"id": "x"}, 1.0), (None, 2.0)]), 4, _no_estimate))


def test_the_no_data_message_quotes_at_most_100_bytes_of_the_first_line_and_names_the_options():
    with pytest.raises(RequestFailed) as e:
        _data([b"{" + b"a" * 200 + b"\n"])
    assert f"the first {'{' + 'a' * 99!r})" in str(e.value)
    assert str(e.value).endswith("check --endpoint and --backend")


def test_the_line_limit_is_inclusive_for_a_first_line_and_after_a_line_end():
    # max_line bytes waiting for their line end pass, one more fails: in the first block and after a
    # block that ended a line
    assert _data([b"data: abcd", b"\ndata: efgh"], max_line=10) == ["abcd", "efgh"]
    with pytest.raises(RequestFailed, match="longer than"):
        _data([b"data: ab", b"cdefg"], max_line=10)


def test_line_ends_split_across_blocks():
    """A LF opening a block ends the previous block's unfinished line, or pairs with its CR."""
    assert _data([b"data: a", b"\ndata: b\r", b"data: c\r", b"\ndata: d\n"]) == ["a", "b", "c", "d"]


def _meta(n):
    return {"meta_info": {} if n is None else {"completion_tokens": n}}


@pytest.mark.parametrize("counts, why", [
    ([None, None], "no event carried meta_info.completion_tokens"),
    ([0, None, 0], "meta_info.completion_tokens stayed 0"),
])
def test_sglang_without_any_token_says_whether_a_count_arrived(counts, why):
    events = [(_meta(n), float(k)) for k, n in enumerate(counts)] + [(None, 9.0)]
    with pytest.raises(RequestFailed, match=f"the stream ended without any token: {why}$"):
        list(sglang_chunks(iter(events), 4))


def _choice(text, **extra):
    return {"choices": [{"index": 0, "text": text, **extra}]}


def _usage(n, obj=None):
    return {**(obj or {"choices": []}), "usage": {"completion_tokens": n}}


def test_openai_text_chunks_then_a_final_usage_time_one_token_each_and_the_usage_is_the_total():
    """llama.cpp: text chunks without usage, the last one carrying the total: that chunk times one
    token like the others, and the total comes at the end as a counts-only chunk."""
    events = [(_choice("a"), 1.0), (_choice("b"), 2.0), (_usage(5, _choice("c")), 3.0), (None, 4.0)]
    assert list(openai_chunks(iter(events), 8, _no_estimate)) == [
        Chunk(1.0, 1), Chunk(2.0, 2), Chunk(3.0, 3), Chunk(4.0, 5, counts_only=True, counted_by="usage")]


def test_openai_per_chunk_usage_that_jumps_times_every_token_it_counts():
    events = [(_usage(3, _choice("abc")), 1.0), (_usage(5, _choice("de")), 2.0), (_usage(5, _choice("")), 3.0),
              (None, 4.0)]
    assert list(openai_chunks(iter(events), 8, _no_estimate)) == [Chunk(1.0, 3), Chunk(2.0, 5)]


def test_openai_an_empty_text_chunk_without_usage_times_nothing_and_the_estimate_gets_the_text_chunks():
    seen = []

    def estimate(ts, texts, n_chunks, max_tokens):
        seen.append((ts, list(texts), n_chunks, max_tokens))
        return Chunk(ts, 7, counts_only=True, counted_by="chunks")

    events = [(_choice(""), 1.0), (_choice("a"), 2.0), (_choice(""), 3.0), (_choice("b"), 4.0),
              ({"choices": [{"index": 0, "finish_reason": "length"}]}, 5.0), (None, 6.0)]
    chunks = list(openai_chunks(iter(events), 8, estimate))
    assert chunks == [Chunk(2.0, 1), Chunk(4.0, 2), Chunk(6.0, 7, counts_only=True, counted_by="chunks")]
    assert seen == [(6.0, ["a", "b"], 2, 8)]


def test_openai_choice_0_is_the_one_without_an_index_or_with_index_0_only():
    events = [({"choices": [{"text": "a"}]}, 1.0), ({"choices": [{"index": 1, "text": "x"}]}, 2.0),
              ({"choices": [{"index": 1, "text": "y"}, {"index": 0, "text": "b"}]}, 3.0), (None, 4.0)]
    est = lambda ts, texts, n, m: Chunk(ts, n, counts_only=True, counted_by="chunks")    # noqa: E731
    assert list(openai_chunks(iter(events), 8, est)) == [
        Chunk(1.0, 1), Chunk(3.0, 2), Chunk(4.0, 2, counts_only=True, counted_by="chunks")]


@pytest.mark.parametrize("events, why", [
    ([_choice("a"), _usage(0)], "usage.completion_tokens stayed 0 although choices[0].text arrived"),
    ([_choice(""), _choice("")], "choices[0].text stayed empty and no event carried usage.completion_tokens"),
    ([_usage(0, _choice("")), _choice("")],
     "choices[0].text stayed empty and usage.completion_tokens did not count up with it"),
    ([_usage(2), _usage(3)], "usage.completion_tokens counted up but no event had choices[0].text"),
    ([{"choices": [{"index": 0, "finish_reason": "stop"}]}], "no event carried choices[0].text or "
                                                            "usage.completion_tokens"),
])
def test_openai_without_any_token_says_what_arrived(events, why):
    stream = [(e, float(k)) for k, e in enumerate(events)] + [(None, 9.0)]
    with pytest.raises(RequestFailed, match=f"^the stream ended without any token: {re.escape(why)}$"):
        list(openai_chunks(iter(stream), 4, _no_estimate))


@pytest.mark.parametrize("value, ok", [(2, True), (2.0, True), (True, False), (2.5, False), ("2", False)])
def test_a_token_count_is_a_whole_number_not_a_bool(value, ok):
    events = [(_meta(value), 1.0), (None, 2.0)]
    if ok:
        assert list(sglang_chunks(iter(events), 4)) == [Chunk(1.0, 2)]
    else:
        with pytest.raises(RequestFailed, match="not a token count"):
            list(sglang_chunks(iter(events), 4))
