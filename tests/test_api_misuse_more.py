"""The documented Python API (salactl/__init__.py) refuses bad arguments with a one-line UsageError,
never a raw AttributeError/TypeError/OverflowError or a silently wrong result: tokenizers that are
not Tokenizers, token ids outside the vocabulary, paths that are not paths."""

import re

import pytest

import salactl
from salactl.errors import UsageError
from salactl.runtime.loader import EMBEDDED_DIR


@pytest.fixture(scope="module")
def tok():
    return salactl.find_tokenizer(None, EMBEDDED_DIR)


def ids_outside(tok) -> str:
    return "^token ids must be non-negative integers, got "


@pytest.mark.parametrize("cls", ["GeneratedText", "StreamDecoder"])
@pytest.mark.parametrize("arg, name", [(None, "NoneType"), ("sala-nano", "str")])
def test_decoders_take_a_tokenizer(cls, arg, name):
    with pytest.raises(UsageError, match=f"^tokenizer must be a Tokenizer \\(find_tokenizer\\(...\\) gives one\\), "
                                         f"got {name}$"):
        getattr(salactl, cls)(arg)


@pytest.mark.parametrize("cls", ["GeneratedText", "StreamDecoder"])
@pytest.mark.parametrize("bad", [-1, "a", 1.0, True, None, [5]])
def test_push_takes_a_token_id(tok, cls, bad):
    text = getattr(salactl, cls)(tok)
    with pytest.raises(UsageError, match=f"^push takes a token id \\(an integer >= 0\\), got {re.escape(repr(bad))}$"):
        text.push(bad)
    assert text.push(tok.encode("hi", add_special_tokens=False)[0]) + text.flush() == "hi"   # not left broken


@pytest.mark.parametrize("cls", ["GeneratedText", "StreamDecoder"])
def test_push_of_an_id_past_the_tokenizer_is_no_text_as_in_hf(tok, cls):
    """A model's vocabulary may pad past its tokenizer's (check_fits allows it); HF decode skips
    such ids, so streaming shows nothing for them rather than failing the run."""
    text = getattr(salactl, cls)(tok)
    ids = tok.encode("hello world", add_special_tokens=False)
    shown = "".join(text.push(i) for i in [ids[0], tok.vocab_size, 2**40, *ids[1:]])
    assert shown + text.flush() == "hello world"


def test_push_checks_the_id_after_a_stop_too(tok):
    text = salactl.GeneratedText(tok, stop="h")
    text.push(tok.encode("hi", add_special_tokens=False)[0])
    assert text.stopped
    with pytest.raises(UsageError, match="^push takes a token id"):
        text.push(-1)


@pytest.mark.parametrize("ids, got", [([-1], "-1"), ([5, -2**40], str(-2**40)), ([5, "a"], "'a'"), ([1.5], "1.5")])
def test_decode_refuses_what_is_not_a_token_id(tok, ids, got):
    with pytest.raises(UsageError, match=ids_outside(tok) + got + "$"):
        tok.decode(ids)


@pytest.mark.parametrize("ids", [None, 5, "hi"])
def test_decode_takes_a_list(tok, ids):
    with pytest.raises(UsageError, match=f"^decode takes a list of token ids, got {ids!r}$"):
        tok.decode(ids)


def test_decode_takes_every_id_of_the_vocabulary(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    assert tok.decode(ids) == "hello world" and tok.decode([]) == ""
    tok.decode([0, tok.vocab_size - 1])


def test_decode_skips_ids_past_the_tokenizer_as_hf_and_push_do(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    assert tok.decode([ids[0], tok.vocab_size, 10**9, 2**40, *ids[1:]]) == "hello world"


@pytest.mark.parametrize("args, named", [((123, None), "explicit \\(--tokenizer: a tokenizer.json or its "
                                                       "directory\\)"),
                                         ((None, 123), "model_dir \\(the checkpoint's directory\\)"),
                                         ((["a"], None), "explicit .*")])
def test_find_tokenizer_takes_paths(args, named):
    got = type(next(a for a in args if a is not None)).__name__
    with pytest.raises(UsageError, match=f"^{named} must be a path \\(a str or Path\\), got {got}$"):
        salactl.find_tokenizer(*args)


def test_tokenizer_takes_a_path():
    with pytest.raises(UsageError, match="^Tokenizer's path \\(a tokenizer.json or its directory\\) must be a path"):
        salactl.Tokenizer(None)
    assert salactl.find_tokenizer(str(EMBEDDED_DIR), None).vocab_size == salactl.Tokenizer(EMBEDDED_DIR).vocab_size


@pytest.mark.parametrize("args, named", [((None, None), "SalaConfig"), (("config", None), "SalaConfig")])
def test_stop_token_ids_takes_a_config(args, named):
    with pytest.raises(UsageError, match=f"^stop_token_ids takes the model's {named}"):
        salactl.stop_token_ids(*args)


def test_stop_token_ids_checks_its_directory_and_tokenizer(tok):
    lm = salactl.load_model(None, device="cpu")
    with pytest.raises(UsageError, match="model's directory"):
        salactl.stop_token_ids(lm.config, 123)
    with pytest.raises(UsageError, match="a salactl Tokenizer"):
        salactl.stop_token_ids(lm.config, lm.model_dir, "tok")
    assert salactl.stop_token_ids(lm.config, lm.model_dir, tok)
