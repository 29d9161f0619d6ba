"""Text encoded in pieces reads as its whole text with a SentencePiece-style tokenizer too (MiniCPM's and
Llama's: a normalizer that prepends "▁" to every string it encodes, or a Metaspace pre-tokenizer that does),
as with sala-nano's ByteLevel one: the passkey prompt decodes to the text its constants describe (no doubled
spaces) with the ids of its whole text, and `eval ppl` encodes a text in pieces, not whole, with the whole
text's ids. Depths that differ only past 6 decimals get passkey trials of their own."""

import json
import random

import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from salactl.data.corpus import corpus_text
from salactl.evaluation.passkey import (ANSWER, FILLER, INSTRUCTION, NEEDLE, QUESTION, answer_ids,
                                        make_passkey_prompt, passkey_trials)
from salactl.evaluation.perplexity import encode_text
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.tokenizer import Tokenizer

LLAMA_DECODER = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])


def _train(hf: HFTokenizer, pre_tokenizer) -> None:
    """BPE over words that start at "▁", from one line at a time, as SentencePiece trains: no token
    spans a word start or holds a newline."""
    hf.pre_tokenizer = pre_tokenizer
    lines = (corpus_text("train")[:300_000] + "".join(FILLER) + NEEDLE + INSTRUCTION + QUESTION).splitlines()
    hf.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>"],
                                                      limit_alphabet=200, initial_alphabet=["\n"],
                                                      show_progress=False))


def minicpm_style(directory) -> Tokenizer:
    """MiniCPM/Llama's tokenizer.json: the Prepend/Replace "▁" normalizer and no pre-tokenizer, with
    <s> put first by tokenizer_config.json (add_bos_token)."""
    hf = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    hf.decoder = LLAMA_DECODER
    _train(hf, pre_tokenizers.Metaspace(prepend_scheme="never"))
    spec = json.loads(hf.to_str())
    spec["pre_tokenizer"] = None
    directory.mkdir()
    (directory / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "add_bos_token": True}))
    return Tokenizer(directory)


def metaspace_style(directory) -> Tokenizer:
    """A Metaspace pre-tokenizer that puts "▁" before every string, without <s>."""
    hf = HFTokenizer(models.BPE(unk_token="<unk>"))
    hf.decoder = decoders.Metaspace()
    _train(hf, pre_tokenizers.Metaspace(prepend_scheme="always"))
    directory.mkdir()
    hf.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                 "bos_token": "<s>", "eos_token": "</s>"}))
    return Tokenizer(directory)


class Counting:
    """The real tokenizer, noting the length of every text it is asked to encode."""

    def __init__(self, tok):
        self.tok, self.asked = tok, []

    def encode(self, text: str, **kwargs) -> list[int]:
        self.asked.append(len(text))
        return self.tok.encode(text, **kwargs)


@pytest.fixture(scope="module", params=["sala-nano", "minicpm-style", "metaspace-style"])
def tok(request, tmp_path_factory):
    build = {"sala-nano": lambda d: Tokenizer(EMBEDDED_DIR), "minicpm-style": minicpm_style,
             "metaspace-style": metaspace_style}[request.param]
    return build(tmp_path_factory.mktemp("tok") / "tokenizer")


def test_the_passkey_prompt_reads_as_its_constants(tok):
    """INSTRUCTION, the filler sentences with the needle among them, and QUESTION (then the answer), joined
    as they are: no piece gains a space of its own, and the ids are those of the prompt's whole text."""
    sentences = "".join(FILLER) * 40
    for length in (90, 200, 600):
        for depth in (0.0, 0.3, 1.0):
            ids, key = make_passkey_prompt(tok, length, depth, random.Random(length))
            text = tok.decode(ids)
            needle = NEEDLE.format(key=key)
            assert text.startswith(INSTRUCTION) and text.endswith(QUESTION) and needle in text, text
            before, after = text[len(INSTRUCTION):-len(QUESTION)].split(needle)
            assert sentences.startswith(before + after), text
            assert tok.encode(text) == ids
            assert tok.decode(ids + answer_ids(tok, key)) == text + ANSWER.format(key=key)


def test_ppl_encodes_a_text_in_pieces_with_the_whole_texts_ids(tok):
    """Pieces are cut (before the whitespace that ends a line) and hold: the ids are the whole text's,
    and no text the tokenizer is asked to encode is much longer than a piece and its cut's check."""
    text = corpus_text("heldout")[:60_000]
    whole = tok.encode(text, add_special_tokens=False, specials_as_text=True)
    for piece in (40, 2000):
        counting = Counting(tok)
        assert encode_text(counting, text, None, "t", piece) == whole
        assert max(counting.asked) < 5 * piece + 600 < len(text)
        assert encode_text(tok, text, 77, "t", piece) == whole[:77]


@pytest.mark.parametrize("run", ["s", "0", "_", "="])
def test_ppl_encodes_a_text_that_starts_with_a_run_with_the_whole_texts_ids(tok, run):
    """The cut checks encode their text as following other text: a first cut inside a run of one character
    at the text's start, which a SentencePiece-style tokenizer merges otherwise after its "▁", is not kept."""
    text = run * 600 + corpus_text("heldout")[:2000]
    for piece in (7, 40):
        assert encode_text(tok, text, None, "t", piece) == tok.encode(text, add_special_tokens=False,
                                                                       specials_as_text=True)


def test_ppl_of_a_few_tokens_encodes_only_the_start_of_a_long_text(tok):
    """101 ids of a 300 KB text ask the tokenizer for a piece and the checks around its cut, not the whole
    text (which took a 162 MB file's `eval ppl --max-tokens 100` to exit 11 with a SentencePiece-style one)."""
    text = corpus_text("heldout")[:300_000]
    counting = Counting(tok)
    ids = encode_text(counting, text, 101, "t", 1000)
    assert ids == tok.encode(text[:5000], add_special_tokens=False, specials_as_text=True)[:101]
    assert sum(counting.asked) < 10_000


def test_depths_that_agree_to_six_decimals_get_their_own_trials():
    """0.5 keeps the keys it always had (seeded with "0.500000"); 0.5000001 gets others."""
    tok = Tokenizer(EMBEDDED_DIR)
    prompts = passkey_trials(tok, [100], [0.5, 0.5000001], 4, 0)
    keys = {d: [p["key"] for p in prompts if p["depth"] == d] for d in (0.5, 0.5000001)}
    assert keys[0.5] != keys[0.5000001]
    assert keys[0.5] == [str(random.Random(f"passkey:0:100:0.500000:{t}").randint(10_000, 99_999))
                         for t in range(4)]
