"""The generated text decoded after the prompt, as vLLM's detokenizer primes itself with a prompt
suffix: a Llama/SentencePiece decoder (the fixture of test_tokenizer_fidelity, like MiniCPM-SALA's)
keeps the first token's leading space, so `run`'s text and a --stop string starting with a space
match vLLM's; sala-nano's ByteLevel text is what it was. The prompt's own last characters never
show in the text: a literal U+FFFD, nor a character its last ids cut that the output leaves cut.
prompt_ids may be a tensor or array, as Engine.generate's prompt. And --stop must be valid UTF-8 text."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from tokenizers.decoders import DecodeStream

from salactl.errors import UsageError
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.stream_decoder import GeneratedText, StreamDecoder, check_stop_strings
from salactl.runtime.tokenizer import Tokenizer
from test_tokenizer_fidelity import build

WORDS = "Hello world the quick brown fox 中文 😀 def main(): print('hi')\n  x".split(" ")


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    return build(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module", params=["sentencepiece", "sala-nano"])
def tok(request, spm_dir):
    return Tokenizer(spm_dir if request.param == "sentencepiece" else EMBEDDED_DIR)


def _vllm_text(tok: Tokenizer, prompt: list[int], out: list[int]) -> str | None:
    """vLLM's FastIncrementalDetokenizer: tokenizers' DecodeStream primed with the shortest prompt
    suffix of 4 to 23 ids that decodes without U+FFFD (else the whole prompt); None where the stream
    fails on text that is not monotonic (invalid UTF-8), which vLLM recovers from by starting afresh."""
    suffix = prompt
    if len(prompt) > 4:
        suffix = next((prompt[-i:] for i in range(4, min(len(prompt) + 1, 24))
                       if "\ufffd" not in tok.tok.decode(prompt[-i:])), prompt)
    stream = DecodeStream(skip_special_tokens=True)
    try:
        for t in suffix:
            stream.step(tok.tok, t)
        return "".join(stream.step(tok.tok, t) or "" for t in out)
    except Exception as e:
        assert "Invalid prefix" in str(e)
        return None


def _pieces(decoder, ids) -> list[str]:
    return [decoder.push(t) for t in ids] + [decoder.flush()]


def test_the_first_token_keeps_its_leading_space(spm_dir):
    tok = Tokenizer(spm_dir)
    prompt, out = tok.encode("Hello"), tok.encode("world test", add_special_tokens=False)
    assert tok.tok.id_to_token(out[0]) == "▁"
    text = GeneratedText(tok, prompt_ids=prompt)
    pieces = _pieces(text, out)
    assert "".join(pieces) == text.text == " world test" == tok.decode(prompt + out)[len("Hello"):]
    assert "".join(_pieces(StreamDecoder(tok, prompt_ids=prompt), out)) == " world test"
    # without the prompt, the decoder's Strip takes the space, as decode(ids) alone does
    assert "".join(_pieces(GeneratedText(tok), out)) == "world test" == tok.decode(out)


@pytest.mark.parametrize("stop, want", [(" world", ""), (" test", " world"), ("d t", " worl")])
def test_a_stop_string_starting_with_a_space_matches_at_the_start(spm_dir, stop, want):
    tok = Tokenizer(spm_dir)
    prompt, out = tok.encode("Hello"), tok.encode("world test", add_special_tokens=False)
    text, shown = GeneratedText(tok, stop=[stop], prompt_ids=prompt), ""
    for t in out:
        shown += text.push(t)
        assert want.startswith(shown)          # nothing after the stop string ever shows
        if text.stopped:
            break
    shown += text.flush()
    assert shown == text.text == want and text.stop_reason == stop


def test_streamed_pieces_join_to_vllms_text_on_random_prompts(tok):
    rng = random.Random(0)
    V = tok.vocab_size
    for _ in range(300):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40)))
        prompt = tok.encode(words) if rng.random() < 0.7 else [rng.randrange(V) for _ in range(rng.randint(0, 40))]
        out = tok.encode(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))), add_special_tokens=False) \
            if rng.random() < 0.5 else [rng.randrange(V) for _ in range(rng.randint(1, 20))]
        got = "".join(_pieces(StreamDecoder(tok, prompt_ids=prompt), out))
        full, before = tok.decode(prompt + out), tok.decode(prompt)
        # flush() gives a cut character at the end as decode() does (U+FFFD); vLLM holds it forever.
        # A prompt ending in U+FFFD (cut or literal) is where vLLM shows it before the output; we don't
        if not full.endswith("\ufffd") and not before.endswith("\ufffd") and \
                (want := _vllm_text(tok, prompt, out)) is not None:
            assert got == want, (prompt, out)
        if full.startswith(before):
            assert got == full[len(before):], (prompt, out)


def test_sala_nano_text_is_what_it_was():
    """ByteLevel decoding is byte concatenation: after a prompt, as alone."""
    tok = Tokenizer(EMBEDDED_DIR)
    rng = random.Random(1)
    for _ in range(200):
        prompt = tok.encode(" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30))))
        out = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 20))]
        assert "".join(_pieces(StreamDecoder(tok, prompt_ids=prompt), out)) == \
            "".join(_pieces(StreamDecoder(tok), out)) == tok.decode(out)


@pytest.mark.parametrize("before", [[], [3 + 0xE6, 3 + 0x96, 3 + 0x87]])     # ... after "文" in the same byte run
def test_a_character_the_prompt_cuts_is_completed_by_the_output_as_in_vllm(spm_dir, before):
    tok = Tokenizer(spm_dir)
    prompt = tok.encode("Hi") + before + [3 + 0xE4, 3 + 0xB8]          # "中" cut after 2 of its 3 bytes
    pieces = _pieces(GeneratedText(tok, prompt_ids=prompt), [3 + 0xAD])
    assert "".join(pieces) == "中" == _vllm_text(tok, prompt, [3 + 0xAD])


def test_the_text_is_only_what_the_generated_ids_add_on_random_ids(tok):
    """Random ids cut characters and byte runs anywhere: the text is what the generated ids add to the
    prompt's text where they leave it as it is ("" for none, or for ids with no text), and where they
    change the prompt's cut tail (complete its character) the text is vLLM's."""
    rng = random.Random(5)
    V, special = tok.vocab_size, sorted(i for i, t in tok.tok.get_added_tokens_decoder().items() if t.special)
    for _ in range(1500):
        prompt = [rng.randrange(V) for _ in range(rng.randint(1, 30))]
        out = [rng.choice(special) if rng.random() < 0.1 else rng.randrange(V) for _ in range(rng.randint(0, 6))]
        stop_id = rng.randrange(V)          # generation ends at it: its text is left out
        out = out[:out.index(stop_id)] if stop_id in out else out
        text = GeneratedText(tok, stop_ids=stop_id, prompt_ids=prompt)
        got = "".join([text.push(t) for t in out + [stop_id]] + [text.flush()])
        assert got == text.text == "".join(_pieces(StreamDecoder(tok, prompt_ids=prompt), out)), (prompt, out)
        full, before = tok.decode(prompt + out), tok.decode(prompt)
        if full.startswith(before):
            assert got == full[len(before):], (prompt, out)
        else:
            assert full.endswith(got) and len(got) >= len(full) - len(before), (prompt, out)
            # vLLM holds a cut character at the end forever, and its stream may show the start of a
            # byte run that later bytes turn into U+FFFD
            if not full.endswith("\ufffd") and (want := _vllm_text(tok, prompt, out)) is not None and \
                    full.endswith(want):
                assert got == want, (prompt, out)


@pytest.mark.parametrize("prompt", ["Replace bad bytes with \ufffd", "\ufffd", "a \ufffd\ufffd b", "x\ufffd\n"])
def test_sala_nano_text_is_what_it_was_after_a_literal_replacement_character(prompt):
    tok = Tokenizer(EMBEDDED_DIR)
    ids, rng = tok.encode(prompt), random.Random(2)
    assert tok.decode(ids).endswith(prompt)
    for out in [tok.encode(".\n\nThe", add_special_tokens=False)] + \
            [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 8))] for _ in range(50)]:
        assert "".join(_pieces(StreamDecoder(tok, prompt_ids=ids), out)) == tok.decode(out), out


def test_a_prompt_cut_mid_character_adds_nothing_to_an_empty_output():
    """sala-nano's ids 225 165 are the first 2 of a 3-byte character (the reviewer's prompt)."""
    tok = Tokenizer(EMBEDDED_DIR)
    prompt = [1, 44, 77, 225, 165, 121]
    cut, eos = tok.encode("Hi 中")[:-1], tok.tok.token_to_id("</s>")
    for p in (prompt, cut, prompt[:-1], cut + [eos]):     # ... and with an EOS (no text) after the cut
        assert tok.decode(p).endswith("\ufffd")
        assert "".join(_pieces(StreamDecoder(tok, prompt_ids=p), [])) == ""
        text = GeneratedText(tok, stop_ids=[70], prompt_ids=p)
        assert text.push(70) + text.flush() == text.text == ""
        assert "".join(_pieces(StreamDecoder(tok, prompt_ids=p), [eos, eos])) == ""    # ids with no text
        assert "".join(_pieces(StreamDecoder(tok, prompt_ids=p), tok.encode("A", add_special_tokens=False))) == "A"


def test_run_text_has_no_replacement_character_from_the_prompt():
    """The reviewer's runs: a prompt ending in a literal U+FFFD, and one cut mid-character with no
    text generated (none, or only the stop id)."""
    tok = Tokenizer(EMBEDDED_DIR)
    r = _run("--prompt", "Replace bad bytes with \ufffd", "--max-new-tokens", "4", "--json", "--no-op-profile")
    rec = json.loads(r.stdout)
    assert r.returncode == 0 and rec["text"] == tok.decode(rec["output_token_ids"]) and "\ufffd" not in rec["text"]
    for args, ids in [(["--max-new-tokens", "0"], []), (["--max-new-tokens", "5", "--stop-token-ids", "70"], [70])]:
        r = _run("--prompt-ids", "1,44,77,225,165,121", "--json", "--no-op-profile", *args)
        rec = json.loads(r.stdout)
        assert r.returncode == 0 and rec["output_token_ids"] == ids and rec["text"] == "", rec


def test_only_the_prompts_last_ids_are_decoded(monkeypatch):
    tok = Tokenizer(EMBEDDED_DIR)
    prompt = tok.encode("def f(x):\n    return x * 2\n" * 20000)
    lengths, real = [], tok.decode
    monkeypatch.setattr(tok, "decode", lambda ids, skip_special=True: (lengths.append(len(ids)), real(ids))[1])
    out = tok.encode(" ok", add_special_tokens=False)
    assert "".join(_pieces(StreamDecoder(tok, prompt_ids=prompt), out)) == " ok"
    assert len(prompt) > 100_000 and max(lengths) <= 23 + len(out)


@pytest.mark.parametrize("bad, match", [("Hello", "prompt_ids must be token ids .*got text 'Hello'"),
                                        ([1, -2], "prompt_ids must hold token ids >= 0, got -2"),
                                        ([1, "a"], "prompt_ids must hold integer token ids, got 'a'"),
                                        (5, "got the scalar 5$"),
                                        (np.int64(5), r"got the scalar np.int64\(5\)$"),
                                        (np.array(5), r"got the scalar array\(5\)$"),
                                        (torch.tensor(5), r"got the scalar tensor\(5\)$"),
                                        (torch.tensor([[1, 2]]), r"got shape \(1, 2\)$"),
                                        (torch.tensor([1.0, 2.0]), "must hold integer token ids, got 1.0")])
def test_bad_prompt_ids_are_a_usage_error(spm_dir, bad, match):
    with pytest.raises(UsageError, match=match) as e:
        GeneratedText(Tokenizer(spm_dir), prompt_ids=bad)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("as_type", [list, tuple, np.array, torch.tensor,
                                     lambda ids: torch.tensor(ids, dtype=torch.int32),
                                     lambda ids: ids + [10**30]])       # an id past the vocabulary has no text
def test_prompt_ids_may_be_what_the_engine_takes(tok, as_type):
    prompt, out = tok.encode("Hello there, how are"), tok.encode(" you doing? 日本語", add_special_tokens=False)
    want = "".join(_pieces(StreamDecoder(tok, prompt_ids=prompt), out))
    assert "".join(_pieces(StreamDecoder(tok, prompt_ids=as_type(prompt)), out)) == want
    assert "".join(_pieces(GeneratedText(tok, prompt_ids=as_type(prompt)), out)) == want


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "salactl", "run", *args], capture_output=True, timeout=300)


def test_run_text_keeps_the_leading_space_and_a_stop_matches_at_the_start(spm_dir):
    """sala-nano's greedy answer to "<s>g." in the fixture's vocabulary starts with "▁The▁"."""
    tok = Tokenizer(spm_dir)
    args = ["--prompt-ids", "1,337", "--tokenizer", str(spm_dir), "--max-new-tokens", "4", "--json",
            "--no-op-profile", "--ignore-eos"]
    r = _run(*args)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    out = rec["output_token_ids"]
    assert tok.tok.id_to_token(out[0]) == "▁The▁"
    assert rec["text"] == _vllm_text(tok, [1, 337], out) and rec["text"].startswith(" The ")
    r = _run(*args, "--stop", " The")
    rec = json.loads(r.stdout)
    assert r.returncode == 0 and rec["text"] == "" and rec["stop_reason"] == " The" and rec["finish_reason"] == "stop"


@pytest.mark.parametrize("stop", ["\udcff", "ok\udce9"])
def test_stop_strings_must_be_valid_utf8(stop):
    with pytest.raises(UsageError, match=r"^stop strings \(--stop\): the text is not valid UTF-8 \(byte 0x(ff|e9) at "
                                         r"character offset \d\); give UTF-8 text"):
        check_stop_strings(["fine", stop])


def test_run_refuses_a_stop_that_is_not_utf8_as_it_refuses_such_a_prompt():
    r = _run("--prompt", "hi", "--max-new-tokens", "1", "--json", "--stop", b"\xff")
    err = r.stderr.decode()
    assert r.returncode == 2 and r.stdout == b"", err
    assert err.count("\n") == 1 and err.startswith("error: stop strings (--stop): the text is not valid UTF-8 "
                                                   "(byte 0xff at character offset 0)"), err
