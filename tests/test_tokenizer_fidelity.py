"""Tokenizer fidelity to HF transformers (AutoTokenizer / apply_chat_template / decode).

The expected ids below were computed ONCE with transformers 4.57.1 + tokenizers 0.22.2 (a separate
venv) on the tokenizers `build` makes here (`AutoTokenizer.from_pretrained(dir).encode(s)`,
`.apply_chat_template([{"role": "user", "content": "Hello world"}], add_generation_prompt=True)`,
`.decode(ids, skip_special_tokens=True)`, `len(tok)`); these tests do not need transformers.
"""
import json
import random
import shutil
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer, models, normalizers, trainers

CORPUS = ["Hello world, this is a test.", "The quick brown fox jumps over the lazy dog.",
          "def main():\n    print('hi')\n", "Paris is the capital of France.",
          "user assistant system"] * 20
CHAT = ["<|im_end|>", "<|im_start|>", "<|tool_call|>"]
PLAIN = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
         "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SYS = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
       "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
       "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
       "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _added(i, content, special=True):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def build(out: Path, post_processor=True, chat_in_json=True, tool_call_special=True, **cfg) -> Path:
    """A MiniCPM/Llama-style tokenizer: BPE with byte_fallback (<0x00>..<0xFF> at ids 3-258), the
    Prepend/Replace "▁" normalizer, the Llama decoder, a "<s> $A" post-processor, and
    <|im_end|>/<|im_start|>/<|tool_call|> as added tokens; `cfg` goes into tokenizer_config.json."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                                        show_progress=False))
    d = json.loads(tok.to_str())
    items = sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {k: i for i, (k, _) in enumerate(items[:3])}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for k, _ in items[3:]:
        vocab.setdefault(k, len(vocab))
    d["model"]["vocab"] = vocab
    n = len(vocab)
    d["added_tokens"] = [_added(i, t) for i, t in enumerate(["<unk>", "<s>", "</s>"])]
    if chat_in_json:
        d["added_tokens"] += [_added(n + i, t, tool_call_special or t != "<|tool_call|>") for i, t in enumerate(CHAT)]
    d["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    d["post_processor"] = None if not post_processor else {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    d["pre_tokenizer"] = None
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(d, ensure_ascii=False))
    decl = {str(i): {"content": t, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False,
                     "special": True} for i, t in enumerate(["<unk>", "<s>", "</s>"] + CHAT)}
    decl = {str(int(k) if int(k) < 3 else n + int(k) - 3): v for k, v in decl.items()}
    base = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>",
            "add_bos_token": True, "add_eos_token": False, "legacy": True, "clean_up_tokenization_spaces": False,
            "added_tokens_decoder": decl, "additional_special_tokens": CHAT, "chat_template": PLAIN}
    base.update(cfg)
    (out / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in base.items() if v != "DROP"}))
    return out

import pytest

from salactl.errors import CheckpointError, TokenizerError
from salactl.runtime.loader import EMBEDDED_DIR, generation_eos_ids, stop_token_ids
from salactl.runtime.stream_decoder import StreamDecoder
from salactl.runtime.tokenizer import Tokenizer

HELLO = [406, 365, 281, 273]                                  # "Hello world" without special tokens
CHAT_PLAIN = [428, 373, 259, 319, 393, 365, 281, 273, 427, 296, 259, 428, 409, 289, 259]
CHAT_SYS = [428, 296, 400, 259, 92, 284, 290, 296, 270, 287, 299, 270, 296, 277, 274, 281, 285, 275, 290, 281,
            409, 289, 264, 427, 296, 259] + CHAT_PLAIN          # MiniCPM3-style default system message first
CJK = [296, 231, 187, 176, 233, 153, 138, 296, 243, 162, 155, 131]  # "中文 😀": byte-fallback pieces


# ------------------------------------------------------------------ 1+2: the checkpoint's chat template
@pytest.mark.parametrize("layout,want", [
    ("plain", CHAT_PLAIN),
    ("sys", CHAT_SYS),                    # tokenizer_config.json "chat_template"
    ("jinja", CHAT_SYS),                  # chat_template.jinja wins over tokenizer_config's
    ("list", CHAT_SYS),                   # a list of named templates: the one named "default"
    ("bostmpl", [1] + CHAT_PLAIN),        # the template's own {{ bos_token }}, and no second BOS
])
def test_chat_ids_match_hf_apply_chat_template(tmp_path, layout, want):
    kw = {"sys": dict(chat_template=SYS), "list": dict(chat_template=[{"name": "tool_use", "template": PLAIN},
                                                                      {"name": "default", "template": SYS}]),
          "bostmpl": dict(chat_template="{{ bos_token }}" + PLAIN)}.get(layout, {})
    d = build(tmp_path, **kw)
    if layout == "jinja":
        (d / "chat_template.jinja").write_text(SYS)
    tok = Tokenizer(d)
    assert tok.has_chat_template and tok.chat_ids("Hello world") == want


def test_no_template_falls_back_to_chatml_without_special_tokens(tmp_path):
    tok = Tokenizer(build(tmp_path, chat_template="DROP"))
    assert not tok.has_chat_template and tok.chat_ids("Hello world") == CHAT_PLAIN


@pytest.mark.parametrize("template,msg", [("{% for m in messages %}", "not valid jinja"),
                                          ("{{ raise_exception('no system role') }}", "no system role")])
def test_bad_chat_template_is_a_one_line_tokenizer_error(tmp_path, template, msg):
    tok = Tokenizer(build(tmp_path, chat_template=template))
    with pytest.raises(TokenizerError) as e:
        tok.chat_ids("hi")
    assert msg in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 5


# ------------------------------------------------------------------ 3: BOS/EOS as HF decides them
@pytest.mark.parametrize("kw,want", [
    ({}, [1] + HELLO),                                                          # LlamaTokenizer, add_bos_token
    ({"add_bos_token": "DROP"}, [1] + HELLO),                                   # Llama default: BOS
    ({"add_bos_token": False}, HELLO),
    ({"add_eos_token": True}, [1] + HELLO + [427]),                             # eos_token <|im_end|>
    ({"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False}, [1] + HELLO),  # post-processor
    ({"tokenizer_class": "PreTrainedTokenizerFast", "add_eos_token": True}, [1] + HELLO),
    ({"tokenizer_class": "PreTrainedTokenizerFast", "post_processor": False}, HELLO),       # add_bos ignored
])
def test_bos_eos_follow_hf_rules(tmp_path, kw, want):
    tok = Tokenizer(build(tmp_path, **kw))
    assert tok.encode("Hello world") == want
    assert tok.encode("Hello world", add_special_tokens=False) == HELLO
    assert tok.add_bos == (want[0] == 1)
    assert tok.encode("中文 😀")[-len(CJK):] == CJK if want[-1] != 427 else tok.encode("中文 😀")[-1] == 427


def test_sala_nano_encodes_with_bos_as_hf_llama_fast_does():
    """HF (LlamaTokenizerFast) on the committed sala-nano: [1, 3274, 326, 1111, 1301]; these are also
    the ids sala-nano was trained with, so they must not change."""
    import json
    import sys

    cfg = json.loads((EMBEDDED_DIR / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "LlamaTokenizerFast"
    tok = Tokenizer(EMBEDDED_DIR)
    assert tok.encode("Hello world") == [1, 3274, 326, 1111, 1301] and tok.add_bos and tok.bos_id == 1
    assert tok.chat_ids("Hi") == [3, 1820, 203, 44, 77, 4, 203, 3, 3149, 583, 843, 203]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))   # the checkout's, not the package's
    try:
        import train_tokenizer
    finally:
        sys.path.pop(0)
    assert train_tokenizer.tokenizer_config(cfg["model_max_length"]) == cfg


# ------------------------------------------------------------------ 4: streaming
def _stream(tok, ids):
    sd = StreamDecoder(tok)
    parts = [sd.push(i) for i in ids]
    return parts, sd.flush()


@pytest.mark.parametrize("which", ["bytefallback", "sala-nano"])
def test_stream_concatenation_equals_decode_on_random_ids(tmp_path, which):
    tok = Tokenizer(build(tmp_path) if which == "bytefallback" else EMBEDDED_DIR)
    rng = random.Random(0)
    V = tok.vocab_size
    for _ in range(200):
        ids = [rng.choice([rng.randrange(V), rng.randrange(3, 259), rng.randrange(3, 259), 1, 427 % V])
               for _ in range(rng.randint(1, 30))]
        parts, tail = _stream(tok, ids)
        assert "".join(parts) + tail == tok.decode(ids), ids


def test_stream_flushes_a_trailing_partial_character(tmp_path):
    tok = Tokenizer(build(tmp_path))
    ids = tok.encode("Hi", add_special_tokens=False) + [3 + 0xE4, 3 + 0xB8]   # "中" cut after 2 of 3 bytes
    parts, tail = _stream(tok, ids)
    assert "".join(parts) == "Hi" and tail == "\ufffd\ufffd" and "".join(parts) + tail == tok.decode(ids)


def test_stream_holds_only_an_incomplete_utf8_tail():
    tok = Tokenizer(EMBEDDED_DIR)                       # byte-level BPE: U+FFFD is the bytes EF BF BD
    ids = tok.encode("a\ufffd", add_special_tokens=False)
    parts, tail = _stream(tok, ids)
    assert "".join(parts) == "a\ufffd" and tail == ""    # a real U+FFFD is text, not a held tail
    cjk = tok.encode("中", add_special_tokens=False)
    assert len(cjk) > 1
    parts, tail = _stream(tok, cjk)
    assert parts[:-1] == [""] * (len(cjk) - 1) and parts[-1] == "中" and tail == ""


def test_stream_decodes_a_short_window_not_everything(monkeypatch):
    tok = Tokenizer(EMBEDDED_DIR)
    ids = tok.encode("def f(x):\n    return x * 2\n" * 60, add_special_tokens=False)
    lengths = []
    real = tok.decode
    monkeypatch.setattr(tok, "decode", lambda ids, skip_special=True: (lengths.append(len(ids)), real(ids))[1])
    sd = StreamDecoder(tok)
    text = "".join(sd.push(i) for i in ids)
    assert len(ids) > 500 and max(lengths) <= 16 and text + sd.flush() == real(ids)


# ------------------------------------------------------------------ 5: stop ids
def test_stop_ids_union_config_generation_config_and_tokenizer(tmp_path):
    import json

    import dataclasses

    from salactl.runtime.config import SalaConfig

    cfg = dataclasses.replace(SalaConfig.from_file(EMBEDDED_DIR / "config.json"), eos_token_id=(2,))
    tok = Tokenizer(build(tmp_path / "tok"))
    assert stop_token_ids(cfg, tmp_path, tok) == (2, 427)                     # no generation_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 4, 7]}))
    assert stop_token_ids(cfg, tmp_path, tok) == (2, 4, 7, 427)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert generation_eos_ids(tmp_path) == (9,) and stop_token_ids(cfg, tmp_path, None) == (2, 9)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"}))
    with pytest.raises(CheckpointError, match="expected an integer or a list"):
        generation_eos_ids(tmp_path)


def test_run_stops_at_generation_config_eos(tmp_path, capsys):
    """HF generate() stops at generation_config.json's eos_token_id; so does `salactl run`."""
    import json

    from conftest import run_cli

    src = shutil.copytree(EMBEDDED_DIR, tmp_path / "nano")
    args = ["run", "--model", src, "-p", "def f(x):", "-n", 6, "--json", "--device", "cpu"]
    code, out, _ = run_cli(args + ["--ignore-eos"], capsys)
    free = json.loads(out)["output_token_ids"]
    assert code == 0 and len(free) == 6
    gen = json.loads((src / "generation_config.json").read_text())
    (src / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [free[2]]}))
    code, out, _ = run_cli(args, capsys)
    d = json.loads(out)
    assert code == 0 and d["output_token_ids"] == free[:free.index(free[2]) + 1] and d["finish_reason"] == "stop"


# ------------------------------------------------------------------ 6: tokens declared in tokenizer_config
@pytest.mark.parametrize("layout", ["added_tokens_decoder", "added_tokens.json"])
def test_tokens_declared_only_in_tokenizer_config_are_added(tmp_path, layout):
    import json

    kw = {} if layout == "added_tokens_decoder" else {"added_tokens_decoder": "DROP"}
    d = build(tmp_path, chat_in_json=False, **kw)
    if layout == "added_tokens.json":
        (d / "added_tokens.json").write_text(json.dumps({t: 427 + i for i, t in enumerate(CHAT)}))
    tok = Tokenizer(d)
    assert tok.vocab_size == 430 and tok.eos_ids == (427,)
    assert tok.encode("a<|im_start|>b<|im_end|>") == [1, 296, 270, 428, 296, 271, 427]
    assert tok.chat_ids("Hello world") == CHAT_PLAIN


def test_special_flag_from_tokenizer_config_wins_for_skip_special(tmp_path):
    tok = Tokenizer(build(tmp_path, tool_call_special=False))      # special only in tokenizer_config
    ids = tok.encode("Hi <|tool_call|> x")
    assert ids == [1, 296, 267, 278, 296, 429, 301, 293] and tok.decode(ids) == "Hi   x"


# ------------------------------------------------------------------ 7: explicit null special tokens
def test_null_bos_and_eos_mean_none(tmp_path):
    tok = Tokenizer(build(tmp_path, bos_token=None, eos_token=None, add_bos_token=False))
    assert tok.bos_id is None and not tok.add_bos and tok.eos_ids == (427,)   # no "<s>" / "</s>" fallback
    assert tok.encode("Hello world") == HELLO
    with pytest.raises(TokenizerError, match="add_bos_token = true but no bos_token"):
        Tokenizer(build(tmp_path / "b", bos_token=None))


def test_a_token_named_in_additional_special_tokens_is_special_whatever_added_tokens_decoder_says(tmp_path):
    """A token listed as special in tokenizer_config is skipped on decode even where added_tokens_decoder says
    special: false, as HF does."""
    d = build(tmp_path, chat_in_json=False)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    for v in cfg["added_tokens_decoder"].values():
        if v["content"] == "<|tool_call|>":
            v["special"] = False
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer(d)
    assert tok.decode(tok.encode("Hi <|tool_call|> x")) == "Hi   x"


def test_a_non_llama_tokenizer_class_gets_no_llama_default_special_tokens(tmp_path):
    """Only a LlamaTokenizer class defaults a missing bos_token/unk_token to <s>/<unk>; a fast one has none."""
    tok = Tokenizer(build(tmp_path, tokenizer_class="PreTrainedTokenizerFast", bos_token="DROP", unk_token="DROP"))
    assert tok.special["bos_token"] is None and tok.special["unk_token"] is None


def test_a_legacy_added_tokens_json_does_not_override_tokenizer_json(tmp_path):
    """added_tokens.json naming a token tokenizer.json already has keeps tokenizer.json's definition (one id)."""
    d = build(tmp_path, tool_call_special=False, added_tokens_decoder="DROP",
              additional_special_tokens=["<|im_end|>", "<|im_start|>"])
    ids = {t["content"]: t["id"] for t in json.loads((d / "tokenizer.json").read_text())["added_tokens"]}
    (d / "added_tokens.json").write_text(json.dumps({"<|tool_call|>": ids["<|tool_call|>"]}))
    assert Tokenizer(d).encode("Hi <|tool_call|> x") == [1, 296, 267, 278, 296, 429, 301, 293]
