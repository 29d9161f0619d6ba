"""min_new_tokens holds back --stop strings as vLLM's min_tokens does (its v1 detokenizer): a stop
string is looked for only once more than min_tokens ids are out, and only a match ending in the text
decoded after the min_tokens-th id counts. GeneratedText against that rule written out, then
`salactl run` on the embedded sala-nano (flag and generation_config.json) on the CPU Engine; the GPU
engine takes the same GeneratedText through run_job's on_token."""

import json

import pytest

from conftest import gpu, run_cli
from test_generation_config_defaults import nano_with
from test_stop_strings import _stream

from salactl.errors import UsageError
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.stream_decoder import GeneratedText, StreamDecoder
from salactl.runtime.tokenizer import Tokenizer

# ids (1-based): 8 'Return', 9 ' a', 17 ' pairs', 19 ' a', 22 '\n\n   ', 25 ' value'
TEXT = 'def f(x):\n    """Return a list of (a, b) pairs containing a string.\n\n    If the value'
STOPS = ["pairs", "(a, b)", "a string.\n", "Return a", "\n\n", "value", "s c", " a", "a"]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(EMBEDDED_DIR)


@pytest.fixture(scope="module")
def ids(tok):
    return tok.encode(TEXT, add_special_tokens=False)


def vllm_text(tok, ids, stop: str, min_tokens: int, prompt_ids=None) -> tuple[str, str | None]:
    """vLLM's IncrementalDetokenizer.update() and check_stop_strings(), one id a step,
    include_stop_str_in_output False: (text, the stop string that ended it or None)."""
    dec, text = StreamDecoder(tok, prompt_ids=prompt_ids), ""
    for n, t in enumerate(ids, 1):
        stop_check_offset = len(text)
        text += dec.push(t)
        if min_tokens and n <= min_tokens:
            stop_check_offset = len(text)
        new_char_count = len(text) - stop_check_offset
        if n > min_tokens and new_char_count:
            index = text.find(stop, 1 - new_char_count - len(stop))
            if index != -1:
                return text[:index], stop
    return text + dec.flush(), None


@pytest.mark.parametrize("stop", STOPS)
def test_stop_strings_with_min_new_tokens_end_the_text_as_vllm_does(tok, ids, stop):
    for minimum in range(len(ids) + 2):
        want, reason = vllm_text(tok, ids, stop, minimum)
        text, pieces = _stream(tok, ids, stop=[stop], min_new_tokens=minimum)
        shown = ""
        for piece in pieces:             # the stream never shows what a later stop string takes back
            shown += piece
            assert want.startswith(shown), (stop, minimum, shown)
        assert (shown, text.text, text.stop_reason) == (want, want, reason), (stop, minimum)


def test_a_stop_string_completed_within_min_new_tokens_does_not_end_the_text(tok, ids):
    first, later = TEXT[:TEXT.find(" a")], TEXT[:TEXT.find(" a string")]
    assert _stream(tok, ids, stop=[" a"])[0].text == first
    assert _stream(tok, ids, stop=[" a"], min_new_tokens=8)[0].text == first      # ' a' is id 9
    text, _ = _stream(tok, ids, stop=[" a"], min_new_tokens=9)
    assert text.text == later and text.stop_reason == " a"                          # the next, id 19
    text, pieces = _stream(tok, ids, stop=[" a"], min_new_tokens=19)
    assert "".join(pieces) == text.text == TEXT and not text.stopped


def test_a_match_begun_within_min_new_tokens_and_ended_after_it_counts(tok, ids):
    """'Return a' is ids 8 and 9: with 8 held back it ends in the 9th's text and stops, cutting text
    of the held-back ids that the stream must not have shown."""
    text, pieces = _stream(tok, ids, stop=["Return a"], min_new_tokens=8)
    assert text.text == TEXT[:TEXT.find("Return")] and text.stop_reason == "Return a"
    assert "Return" not in "".join(pieces)
    assert not _stream(tok, ids, stop=["Return a"], min_new_tokens=9)[0].stopped


def test_min_new_tokens_holds_back_no_more_text_than_a_stop_string_may_take(tok, ids):
    """While the stop strings are held back, each push shows what it would without min_new_tokens
    and no match: all but the last len(stop) - 1 characters."""
    _, held = _stream(tok, ids, stop=["pairs"], min_new_tokens=len(ids))
    _, plain = _stream(tok, ids, stop=["qqqqq"])
    assert held == plain and "".join(held) == TEXT


@pytest.mark.parametrize("bad", [-1, "3", 2.0, True])
def test_min_new_tokens_must_be_an_integer_of_at_least_0(tok, bad):
    with pytest.raises(UsageError, match=r"^min_new_tokens \(--min-new-tokens\) must be an integer >= 0, got "):
        GeneratedText(tok, stop=["a"], min_new_tokens=bad)


# ---- salactl run on the embedded sala-nano: greedy '\n    """Return a list of (a, b) pairs containing a
# string.' from "def f(x):", ' a' its 4th id, then its 14th
FIRST, LATER = '\n    """Return', '\n    """Return a list of (a, b) pairs containing'


def _run(capsys, *args, json_out=True):
    code, out, err = run_cli(["run", "--prompt", "def f(x):", "-n", "24", "--stop", " a", "--no-op-profile",
                              *(["--json"] if json_out else []), *map(str, args)], capsys)
    assert code == 0, err
    return json.loads(out) if json_out else out


def test_run_min_new_tokens_holds_back_a_stop_string(capsys):
    rec = _run(capsys, "--device", "cpu")
    assert (rec["text"], len(rec["output_token_ids"]), rec["stop_reason"]) == (FIRST, 4, " a")
    rec = _run(capsys, "--device", "cpu", "--min-new-tokens", "6")
    assert (rec["text"], len(rec["output_token_ids"])) == (LATER, 14)
    assert rec["finish_reason"] == "stop" and rec["stop_reason"] == " a"
    rec = _run(capsys, "--device", "cpu", "--min-new-tokens", "30")       # past -n 24: never stops
    assert rec["text"].startswith(LATER + " a string.") and rec["finish_reason"] == "length"
    # streamed: the text printed ends before the later ' a', and nothing past it is shown
    assert _run(capsys, "--device", "cpu", "--min-new-tokens", "6", json_out=False).startswith(LATER + "\n")


def test_run_min_new_tokens_from_generation_config_holds_back_a_stop_string(tmp_path, capsys):
    rec = _run(capsys, "--device", "cpu", "--model", nano_with(tmp_path, min_new_tokens=6))
    assert rec["sampling_source"]["min_new_tokens"] == "generation_config"
    assert (rec["text"], len(rec["output_token_ids"]), rec["stop_reason"]) == (LATER, 14, " a")


@gpu
def test_run_min_new_tokens_holds_back_a_stop_string_on_the_gpu_engine(capsys):
    """Against the rule applied to the GPU engine's own greedy ids (--ignore-eos: min_new_tokens then
    bans no id, so every run samples the same ones)."""
    tok = Tokenizer(EMBEDDED_DIR)
    free = _run(capsys, "--device", "cuda", "--ignore-eos", "--min-new-tokens", "30")
    for minimum in (0, 6):
        want, reason = vllm_text(tok, free["output_token_ids"], " a", minimum, free["prompt_token_ids"])
        rec = _run(capsys, "--device", "cuda", "--ignore-eos", "--min-new-tokens", minimum)
        assert (rec["text"], rec["stop_reason"]) == (want, reason)
