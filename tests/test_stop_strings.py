"""Stop strings and stop ids as vLLM applies them (include_stop_str_in_output=False): GeneratedText
holds back what may turn into a stop string and cuts the text before it; on_token returning True
ends a generation on both engines (the GPU engine on the GPU where there is one, else in Triton's
interpreter on the CPU)."""

import importlib.util
import os

import pytest
import torch

from conftest import micro_model
from salactl.errors import UsageError
from salactl.runtime.engine import Engine
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.sampling import SamplingParams
from salactl.runtime.stream_decoder import GeneratedText, StreamDecoder
from salactl.runtime.tokenizer import Tokenizer

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before triton is first imported (GPU engine test)
DEV = "cuda" if torch.cuda.is_available() else "cpu"

TEXT = 'def f(x):\n    """Return a list of (a, b) pairs containing a string.\n\n    If the value'


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(EMBEDDED_DIR)


def _stream(tok, ids, **kw) -> tuple[GeneratedText, list[str]]:
    """Each id pushed in turn until the text stops, then flushed: (text, every piece returned)."""
    text, pieces = GeneratedText(tok, **kw), []
    for t in ids:
        pieces.append(text.push(t))
        if text.stopped:
            break
    pieces.append(text.flush())
    return text, pieces


# strings across token boundaries (' pa|irs' is one token ' pairs', '(a, b)' is five)
@pytest.mark.parametrize("stop", ["pairs", "(a, b)", "a string.\n", "Return a", "\n\n", "value", "s c"])
def test_the_stream_never_shows_text_that_a_stop_string_later_takes_back(tok, stop):
    ids = tok.encode(TEXT, add_special_tokens=False)
    want = TEXT[:TEXT.find(stop)]
    text, pieces = _stream(tok, ids, stop=[stop])
    shown = ""
    for piece in pieces:
        shown += piece
        assert want.startswith(shown), (stop, shown)
    assert shown == text.text == want and text.stop_reason == stop


def test_without_a_match_everything_is_shown_by_the_end(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    text, pieces = _stream(tok, ids, stop=["nowhere in it"])
    assert "".join(pieces) == text.text == TEXT and not text.stopped
    assert pieces[-1] and len(pieces[-1]) <= len("nowhere in it") - 1      # the held-back tail


def test_without_stop_strings_each_token_shows_its_text_at_once(tok):
    """Nothing is held back when no stop string can form: every settled piece is shown by its push,
    exactly as the stream decoder settles it."""
    ids = tok.encode(TEXT, add_special_tokens=False)
    _, pieces = _stream(tok, ids)
    assert pieces[-1] == ""
    plain = StreamDecoder(tok)
    assert pieces[:-1] == [plain.push(t) for t in ids]


def test_the_earliest_completed_stop_string_ends_the_text_and_on_one_id_the_first_listed(tok):
    """As vLLM: a string completed by an earlier id wins; of those one id completes, the first in the
    list, even where another starts earlier (more in test_stop_string_order_s66.py)."""
    ids = tok.encode(TEXT, add_special_tokens=False)
    text, _ = _stream(tok, ids, stop=["pairs", "b) pairs", "list"])
    assert text.text == TEXT[:TEXT.find("list")] and text.stop_reason == "list"
    text, _ = _stream(tok, ids, stop=["pairs", "b) pairs"])     # both complete with the same id
    assert text.text == TEXT[:TEXT.find("pairs")] and text.stop_reason == "pairs"
    text, _ = _stream(tok, ids, stop=["b) pairs", "pairs"])
    assert text.text == TEXT[:TEXT.find("b) pairs")] and text.stop_reason == "b) pairs"


def test_a_stop_ids_text_is_left_out(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    end = ids.index(tok.encode(" pairs", add_special_tokens=False)[0])
    text, pieces = _stream(tok, ids[:end + 1], stop_ids={ids[end]})
    assert "".join(pieces) == text.text == tok.decode(ids[:end]) and not text.stopped


@pytest.mark.parametrize("stop", [[""], ["ok", ""], [3]])
def test_stop_strings_must_be_non_empty_text(tok, stop):
    with pytest.raises(UsageError, match=r"stop strings \(--stop\) must be non-empty text"):
        GeneratedText(tok, stop=stop)


def test_no_stop_strings_is_none_and_a_non_list_is_a_usage_error(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    text, pieces = _stream(tok, ids, stop=None)
    assert "".join(pieces) == text.text == TEXT and not text.stopped
    with pytest.raises(UsageError, match="must be text or a list of texts, got 3"):
        GeneratedText(tok, stop=3)


def _stop_at(n: int, seen: list[int]):
    """An on_token that records every id and asks to stop at the n-th."""
    def on_token(t: int) -> bool:
        seen.append(t)
        return len(seen) == n
    return on_token


def test_on_token_returning_true_ends_an_engine_generation_as_stop():
    engine = Engine(micro_model())
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    free = engine.generate([5, 6, 7], params).output_token_ids
    seen: list[int] = []
    res = engine.generate([5, 6, 7], params, on_token=_stop_at(3, seen))
    assert res.output_token_ids == seen == free[:3] and res.finish_reason == "stop"
    assert res.decode.forward_calls == res.decode.tokens == 2
    seen = []                                # a stop id still reaches on_token
    res = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=8, stop_token_ids=free[1]),
                          on_token=lambda t: seen.append(t))
    assert res.output_token_ids == seen == free[:2] and res.finish_reason == "stop"
    # only True stops: a callback returning something else truthy does not
    assert engine.generate([5, 6, 7], params, on_token=lambda t: 1).output_token_ids == free


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="GPUEngine needs triton")
@pytest.mark.parametrize("n", [1, 3])
def test_on_token_returning_true_ends_a_gpu_engine_generation_as_stop(n):
    """n=1: the step that samples the first token decodes the second as well; it is dropped."""
    from salactl.runtime.gpu.engine import GPUEngine

    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    free = Engine(micro_model()).generate([5, 6, 7], params).output_token_ids
    gpu = GPUEngine(micro_model().to(DEV), DEV, max_running_requests=2, chunk_size=32, kv_tokens=256)
    seen: list[int] = []
    res = gpu.generate([5, 6, 7], params, on_token=_stop_at(n, seen))
    assert res.output_token_ids == seen == free[:n] and res.finish_reason == "stop"
    assert res.decode.tokens == n - 1
    sched = gpu.scheduler
    assert not gpu.requests and not sched.has_work() and sched.slots.free == sched.slots.total
