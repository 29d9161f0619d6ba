"""Which of several --stop strings ends the text, as vLLM's v1 detokenizer decides
(check_stop_strings, one id a step): after each id, the stop strings are tried in the order given,
each searched (str.find) from len(stop) - 1 characters before that id's text; the first one found
wins, cut at its first occurrence there, even where a string listed later starts earlier. A string
completed by an earlier id has ended the text before a later id is looked at, whatever the order.
GeneratedText against that rule written out, then `salactl run --stop A --stop B` on the embedded
sala-nano on the CPU Engine (the GPU engine takes the same GeneratedText through run_job's
on_token)."""

import itertools
import json

import pytest

from conftest import gpu, run_cli
from test_stop_strings import _stream

from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.stream_decoder import StreamDecoder
from salactl.runtime.tokenizer import Tokenizer

# ids (1-based): 9 ' a', 10 ' list', 17 ' pairs', 21 '.', 22 '\n\n   '
TEXT = 'def f(x):\n    """Return a list of (a, b) pairs containing a string.\n\n    If the value'
STOPS = ["pairs", "b) pairs", "(a, b)", "list", "Return a", " a", "\n\n", "  ", "\n", "s c", "value"]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(EMBEDDED_DIR)


@pytest.fixture(scope="module")
def ids(tok):
    return tok.encode(TEXT, add_special_tokens=False)


def vllm_text(tok, ids, stops: list[str], min_tokens: int = 0,
              prompt_ids=None) -> tuple[str, str | None]:
    """vLLM's IncrementalDetokenizer.update() and check_stop_strings(), one id a step,
    include_stop_str_in_output False: (text, the stop string that ended it or None)."""
    dec, text = StreamDecoder(tok, prompt_ids=prompt_ids), ""
    for n, t in enumerate(ids, 1):
        before = len(text)
        text += dec.push(t)
        new_char_count = len(text) - before
        if n <= min_tokens or not new_char_count:
            continue
        for stop in stops:
            index = text.find(stop, 1 - new_char_count - len(stop))
            if index != -1:
                return text[:index], stop
    return text + dec.flush(), None


def _check(tok, ids, stops, minimum=0):
    want, reason = vllm_text(tok, ids, stops, minimum)
    text, pieces = _stream(tok, ids, stop=stops, min_new_tokens=minimum)
    shown = ""
    for piece in pieces:                 # the stream never shows what a later cut takes back
        shown += piece
        assert want.startswith(shown), (stops, minimum, shown)
    assert (shown, text.text, text.stop_reason) == (want, want, reason), (stops, minimum)
    return text


def test_the_first_listed_stop_string_wins_over_one_that_starts_earlier(tok, ids):
    """' pairs' completes both: the one listed first ends the text, at its own match."""
    text = _check(tok, ids, ["pairs", "b) pairs"])
    assert text.text == TEXT[:TEXT.find("pairs")] and text.stop_reason == "pairs"
    text = _check(tok, ids, ["b) pairs", "pairs"])
    assert text.text == TEXT[:TEXT.find("b) pairs")] and text.stop_reason == "b) pairs"


def test_a_stop_string_completed_by_an_earlier_id_wins_whatever_the_order(tok, ids):
    for stops in itertools.permutations(["b) pairs", "list", "pairs"]):
        text = _check(tok, ids, list(stops))
        assert text.text == TEXT[:TEXT.find("list")] and text.stop_reason == "list"
    for stops in (["Return a list", " a"], [" a", "Return a list"]):   # ' a': id 9, ' list': 10
        assert _check(tok, ids, stops).stop_reason == " a"


def test_the_chosen_string_is_cut_at_its_first_occurrence_in_the_new_text(tok, ids):
    """'\\n\\n   ' (id 22, the ones before held back) holds '\\n' twice and '  ' twice: the first of
    each; the text kept may hold a stop string listed later ('\\n\\n' before the first '  ')."""
    head = TEXT[:TEXT.find("\n\n")]
    assert _check(tok, ids, ["\n"], 21).text == head
    text = _check(tok, ids, ["  ", "\n\n"], 21)
    assert text.text == head + "\n\n" and text.stop_reason == "  "
    text = _check(tok, ids, ["\n\n", "  "], 21)
    assert text.text == head and text.stop_reason == "\n\n"


@pytest.mark.parametrize("minimum", [0, 8, 9, 16, 21])
def test_every_pair_of_stop_strings_ends_the_text_as_vllm_does(tok, ids, minimum):
    for stops in itertools.permutations(STOPS, 2):
        _check(tok, ids, list(stops), minimum)


# ---- salactl run on the embedded sala-nano: greedy '\n    """Return a list of (a, b) pairs containing a
# string.' from "def f(x):", ' pairs' its 12th id
HEAD = '\n    """Return a list of (a, '


def _run(capsys, *args, json_out=True):
    code, out, err = run_cli(["run", "--prompt", "def f(x):", "-n", "24", "--no-op-profile",
                              *(["--json"] if json_out else []), *map(str, args)], capsys)
    assert code == 0, err
    return json.loads(out) if json_out else out


def test_run_ends_at_the_first_listed_stop_string(capsys):
    rec = _run(capsys, "--device", "cpu", "--stop", "pairs", "--stop", "b) pairs")
    got = (rec["text"], rec["stop_reason"], len(rec["output_token_ids"]))
    assert got == (HEAD + "b) ", "pairs", 12)
    rec = _run(capsys, "--device", "cpu", "--stop", "b) pairs", "--stop", "pairs")
    assert (rec["text"], rec["stop_reason"]) == (HEAD, "b) pairs")
    # streamed: the printed text ends at the listed-first string, nothing past it shown
    out = _run(capsys, "--device", "cpu", "--stop", "pairs", "--stop", "b) pairs",
               json_out=False)
    assert out.startswith(HEAD + "b) \n")


@gpu
def test_run_ends_at_the_first_listed_stop_string_on_the_gpu_engine(capsys):
    """Against the rule applied to the GPU engine's own greedy ids."""
    tok = Tokenizer(EMBEDDED_DIR)
    free = _run(capsys, "--device", "cuda", "--ignore-eos")
    for stops in (["pairs", "b) pairs"], ["b) pairs", "pairs"]):
        want, reason = vllm_text(tok, free["output_token_ids"], stops, 0, free["prompt_token_ids"])
        flags = [a for s in stops for a in ("--stop", s)]
        rec = _run(capsys, "--device", "cuda", "--ignore-eos", *flags)
        assert (rec["text"], rec["stop_reason"]) == (want, reason)
