"""tokenizer_config.json's add_prefix_space, as transformers 4.57 AutoTokenizer applies it.

PreTrainedTokenizerFast.__init__ (so GPT2/Qwen2/CodeLlama's fast classes too) sets the value, false
where the key is missing, on a pre-tokenizer that has the field at its top level (ByteLevel); null
or a non-boolean leaves it as it is, and one inside a Sequence keeps its own. LlamaTokenizerFast
(the class of a MiniCPM config without tokenizer_class) given a value rebuilds itself from the
SentencePiece tokenizer.model (from_slow), which salactl cannot: a warning naming the command that
has transformers rewrite tokenizer.json (the key stays in the config it saves, so a refusal would last). The expected
behaviour was checked once against transformers 4.57.1 + tokenizers 0.22.2 on these same files.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

from salactl.errors import TokenizerError
from salactl.runtime.tokenizer import Tokenizer

CORPUS = ["Hello world, hello there. The quick brown fox jumps over the lazy dog."] * 30
TEXT = "Hello world"
MISSING = object()


def _bytelevel_json(prefix: bool, sequence: bool = False) -> str:
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    bl = pre_tokenizers.ByteLevel(add_prefix_space=prefix)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl]) \
        if sequence else bl
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok.to_str()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return {name: _bytelevel_json(prefix, seq)
            for name, prefix, seq in (("no_prefix", False, False), ("prefix", True, False), ("seq", False, True))}


def _dir(tmp_path: Path, tokenizer_json: str, cls, value) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tokenizer.json").write_text(tokenizer_json)
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    if cls is not None:
        cfg["tokenizer_class"] = cls
    if value is not MISSING:
        cfg["add_prefix_space"] = value
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tmp_path


def _ids(text: str, tokenizer_json: str) -> list[int]:
    """The file's own ids, as the `tokenizers` library gives them."""
    return HFTokenizer.from_str(tokenizer_json).encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("cls", ["GPT2TokenizerFast", "GPT2Tokenizer", "Qwen2TokenizerFast", "PreTrainedTokenizerFast",
                                 "CodeLlamaTokenizerFast"])
def test_true_gives_a_leading_word_its_prefix_space(tmp_path, files, cls):
    tok = Tokenizer(_dir(tmp_path, files["no_prefix"], cls, True))
    # the leading word is encoded as after a space, as the ByteLevel pre-tokenizer with add_prefix_space does
    assert tok.encode(TEXT, add_special_tokens=False) == _ids(" " + TEXT, files["no_prefix"])
    assert tok.encode(TEXT, add_special_tokens=False) != _ids(TEXT, files["no_prefix"])
    assert tok.decode(tok.encode(TEXT, add_special_tokens=False)).strip() == TEXT


@pytest.mark.parametrize("value, prefixed", [(MISSING, False), (False, False), (None, True), (True, True)])
def test_a_bytelevel_prefix_space_follows_the_config(tmp_path, files, value, prefixed):
    """tokenizer.json's ByteLevel has add_prefix_space: true; transformers sets the config's value,
    false where the key is missing, and leaves it only for null."""
    tok = Tokenizer(_dir(tmp_path, files["prefix"], "PreTrainedTokenizerFast", value))
    off = json.loads(files["prefix"])
    off["pre_tokenizer"]["add_prefix_space"] = False
    with_prefix, without = _ids(TEXT, files["prefix"]), _ids(TEXT, json.dumps(off))
    assert with_prefix != without
    assert tok.encode(TEXT, add_special_tokens=False) == (with_prefix if prefixed else without)


def test_a_nested_bytelevel_keeps_its_own(tmp_path, files):
    tok = Tokenizer(_dir(tmp_path, files["seq"], "Qwen2TokenizerFast", True))
    assert tok.encode(TEXT, add_special_tokens=False) == _ids(TEXT, files["seq"])


@pytest.mark.parametrize("cls", [None, "LlamaTokenizerFast", "LlamaTokenizer"])
@pytest.mark.parametrize("value", [True, False])
def test_llama_with_a_value_warns_and_reads_tokenizer_json(tmp_path, files, cls, value, capsys):
    from salactl.output import _warned
    _warned.clear()
    tok = Tokenizer(_dir(tmp_path, files["no_prefix"], cls, value))
    assert tok.encode(TEXT, add_special_tokens=False) == _ids(TEXT, files["no_prefix"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and f"add_prefix_space = {json.dumps(value)}" in err[0]
    assert "tokenizer.model" in err[0] and "save_pretrained" in err[0]


@pytest.mark.parametrize("cls", [None, "LlamaTokenizerFast"])
@pytest.mark.parametrize("value", [MISSING, None])
def test_llama_without_a_value_reads_tokenizer_json_as_it_is(tmp_path, files, cls, value):
    tok = Tokenizer(_dir(tmp_path, files["prefix"], cls, value))
    assert tok.encode(TEXT, add_special_tokens=False) == _ids(TEXT, files["prefix"])


@pytest.mark.parametrize("value", ["true", 1, [True]])
def test_a_non_boolean_is_refused(tmp_path, files, value):
    with pytest.raises(TokenizerError, match=r"add_prefix_space = .*expected true, false or null"):
        Tokenizer(_dir(tmp_path, files["no_prefix"], "GPT2TokenizerFast", value))


def test_cli_warns_for_llama_with_a_value(tmp_path, files):
    d = _dir(tmp_path / "tok", files["no_prefix"], "LlamaTokenizerFast", True)
    r = subprocess.run([sys.executable, "-m", "salactl", "run", "--model", "sala-nano", "--tokenizer", str(d),
                        "--prompt", "Hello", "-n", "1", "--device", "cpu", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stderr.splitlines() if "add_prefix_space" in ln][0].startswith("warning: ")
    assert len(json.loads(r.stdout)["output_token_ids"]) == 1
