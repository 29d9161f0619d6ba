"""Tokenizer: HF `tokenizers` (tokenizer.json) loaded the way transformers' AutoTokenizer loads it,
so that ids match HF:
- special/added tokens declared only in tokenizer_config.json (`added_tokens_decoder`, or the legacy
  added_tokens.json) are added with their special flags, as `PreTrainedTokenizerFast.__init__` does;
- BOS/EOS: Llama-class tokenizers (`LLAMA_CLASSES`) follow add_bos_token (default true) and
  add_eos_token (default false); any other class follows tokenizer.json's post_processor;
- add_prefix_space: any class but LlamaTokenizerFast sets it (false where the key is missing, kept for
  null) on a pre-tokenizer that has it at its top level (ByteLevel), as `PreTrainedTokenizerFast.__init__`
  does; LlamaTokenizerFast given a value rebuilds itself from tokenizer.model (from_slow): a warning;
- `--chat` renders the checkpoint's own chat template (chat_template.jinja, else tokenizer_config's
  "chat_template", from a named list as transformers picks it) with jinja2 as
  `apply_chat_template(..., add_generation_prompt=True)` does and tokenizes the text without special
  tokens (runtime/chat_template.py). Only a checkpoint without a template gets ChatML.
Streaming detokenization is runtime/stream_decoder.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from salactl.errors import TokenizerError, UsageError
from salactl.runtime.chat_template import (CHATML_MARKERS, chatml, compile_template, pick_template,
                                           read_chat_template)
from salactl.runtime.json_file import check_regular_file, is_dir, lookup, read_optional_json
from salactl.runtime.sampling import is_int
from salactl.runtime.surrogates import lone_surrogate_at

# transformers classes whose __init__ rebuilds the post-processor from add_bos_token/add_eos_token
LLAMA_CLASSES = frozenset({"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast"})
# LlamaTokenizerFast.__init__: an add_prefix_space that is not null rebuilds it from tokenizer.model (from_slow)
SLOW_PREFIX_SPACE_CLASSES = frozenset({None, "LlamaTokenizer", "LlamaTokenizerFast"})
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_VOCAB_SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token")   # must be in the vocabulary when named
LLAMA_DEFAULTS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}   # LlamaTokenizerFast.__init__
MAX_TOKENIZER_FILE = 2**30     # the `tokenizers` library reads tokenizer.json whole; real ones are tens of MiB
# Text that encode(continuation=True) puts before its text and then drops, each tried until one's ids stay a
# prefix (the text's first token did not merge into it): a line break, then characters words seldom merge with
CONTINUATION_ANCHORS = ("\n", ".", "\x00")
_READ_CHUNK = 2**20


class Tokenizer:
    """A checkpoint's tokenizer.json (path: the file or its directory), encoding and decoding as
    transformers' AutoTokenizer does for it. find_tokenizer() finds the one a model needs."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        _check_path(path, "Tokenizer's path (a tokenizer.json or its directory)")
        path = Path(path)
        file = path / "tokenizer.json" if is_dir(path, TokenizerError) else path
        _refuse_sentencepiece(file)
        if not lookup(file, TokenizerError):
            raise TokenizerError(f"no tokenizer.json at {file}; pass --tokenizer PATH (a tokenizer.json or "
                                 "its directory)")
        text = _read_tokenizer_json(file)
        try:
            # from the text, not from_file: the library takes only a path that is valid UTF-8, and under
            # a non-UTF-8 locale Python holds a non-ASCII directory name as lone surrogates
            self.tok = HFTokenizer.from_str(text)
        except Exception as e:  # tokenizers raises plain Exceptions for bad files
            raise TokenizerError(f"{file} is not a valid tokenizer.json ({str(e).splitlines()[0]})") from None
        self.path = file
        _require_normal_tokens(self.tok, file)
        cfg_file = file.parent / "tokenizer_config.json"
        cfg = _read_json(cfg_file)
        tokenizer_class = cfg.get("tokenizer_class")
        if tokenizer_class is not None and not isinstance(tokenizer_class, str):
            raise TokenizerError(f"{cfg_file} has tokenizer_class = {json.dumps(tokenizer_class)}; expected a class "
                                 "name string such as \"LlamaTokenizerFast\" (or null)")
        # no tokenizer_class: HF picks the class from config.json's model_type (MiniCPM: Llama)
        llama = tokenizer_class is None or tokenizer_class in LLAMA_CLASSES
        flags = {}
        for key, default in (("add_bos_token", True), ("add_eos_token", False)):
            v = cfg.get(key, default)
            if v is not None and not isinstance(v, bool):
                raise TokenizerError(f"{cfg_file} has {key} = {json.dumps(v)}; expected true or false")
            flags[key] = bool(v)

        # special tokens: tokenizer_config.json (an explicit null means none); in the legacy layout
        # (no added_tokens_decoder) special_tokens_map.json overrides it, as in HF; a key missing from
        # both takes LlamaTokenizerFast's default ("<s>", "</s>", "<unk>") for a Llama class
        legacy = "added_tokens_decoder" not in cfg
        stm_file = file.parent / "special_tokens_map.json"
        stm = _read_json(stm_file) if legacy else {}
        self.special: dict[str, str | None] = {}
        self._named: dict[str, Path] = {}       # special tokens the files name (not LLAMA_DEFAULTS) -> that file
        for key in SPECIAL_KEYS:
            value = _token(cfg, key, cfg_file)
            if key in stm:
                value = _token(stm, key, stm_file)
            elif key not in cfg and llama:
                value = LLAMA_DEFAULTS.get(key)
            if key in stm or key in cfg:
                self._named[key] = stm_file if key in stm else cfg_file
            self.special[key] = value
        extra = cfg.get("additional_special_tokens") or []
        if not isinstance(extra, list):
            raise TokenizerError(f"{cfg_file} has additional_special_tokens = {json.dumps(extra)}; expected a list")
        if legacy and isinstance(stm.get("additional_special_tokens"), list):
            extra = list(extra) + [t for t in stm["additional_special_tokens"] if t not in extra]
        self.additional_special = [_token({"t": t}, "t", cfg_file) for t in extra]
        self._add_declared_tokens(cfg, cfg_file, legacy)

        if llama:
            self._llama_post_processor(flags["add_bos_token"], flags["add_eos_token"], cfg_file)
        self._add_prefix_space(cfg, cfg_file, tokenizer_class)
        self.prefix_ids = self._template_prefix()
        self.add_bos = bool(self.prefix_ids)            # default encoding starts with BOS (eval prepends it per window)
        bos = self.special["bos_token"]
        self.bos_id = self.prefix_ids[0] if len(self.prefix_ids) == 1 else \
            (self.tok.token_to_id(bos) if bos else None)
        eos = [self.tok.token_to_id(t) for t in (self.special["eos_token"], "<|im_end|>") if t]
        self.eos_ids = tuple(dict.fromkeys(i for i in eos if i is not None))
        self.chat_templates = read_chat_template(file.parent, cfg, cfg_file)   # name -> (template, its source)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)   # every id, added tokens too
        self._compiled = {}
        self._anchors = self._continuation_anchors()

    # ---------------------------------------------------------------- loading, as transformers does
    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys([t for t in self.special.values() if t] + self.additional_special))

    def _add_declared_tokens(self, cfg: dict, cfg_file: Path, legacy: bool) -> None:
        """PreTrainedTokenizerFast.__init__: tokens of added_tokens_decoder (or added_tokens.json) that
        tokenizer.json lacks (or declares with other flags), then every named special token that is
        not an added token yet; special when flagged so or named among the special tokens."""
        from tokenizers import AddedToken

        declared = []
        if not legacy:
            dec = cfg["added_tokens_decoder"]
            if not isinstance(dec, dict):
                raise TokenizerError(f"{cfg_file} has a non-object added_tokens_decoder; fix or remove it")
            for idx, t in sorted(dec.items(), key=lambda kv: _int(kv[0], cfg_file)):
                if not isinstance(t, dict) or not isinstance(t.get("content"), str):
                    raise TokenizerError(f"{cfg_file} has added_tokens_decoder[{idx}] = {json.dumps(t)}; "
                                         "expected an object with a 'content' string")
                declared.append(AddedToken(t["content"], single_word=bool(t.get("single_word", False)),
                                           lstrip=bool(t.get("lstrip", False)), rstrip=bool(t.get("rstrip", False)),
                                           normalized=bool(t.get("normalized", True)),
                                           special=bool(t.get("special", False))))
        else:
            at_file = cfg_file.parent / "added_tokens.json"
            at = _read_json(at_file)
            have = self.tok.get_added_tokens_decoder()
            specials = set(self.all_special_tokens)
            for content, idx in sorted(at.items(), key=lambda kv: _int(kv[1], at_file)):
                if int(idx) in have:                     # tokenizer.json's own entry wins (HF: legacy branch)
                    continue
                special = content in specials
                declared.append(AddedToken(content, rstrip=False, lstrip=False, normalized=not special,
                                           special=special))
        existing = {repr(t) for t in self.tok.get_added_tokens_decoder().values()}
        to_add = [t for t in declared if repr(t) not in existing]
        encoder = {t.content for t in self.tok.get_added_tokens_decoder().values()} | {t.content for t in to_add}
        self._note_appended_specials(encoder)
        to_add += [s for s in self.all_special_tokens if s not in encoder]
        specials = set(self.all_special_tokens)
        tokens = []
        for t in to_add:
            if isinstance(t, str):
                tokens.append(AddedToken(t, special=t in specials))
            else:
                t.special = t.special or t.content in specials
                tokens.append(t)
        if tokens:
            self.tok.add_tokens(tokens)

    def _note_appended_specials(self, added: set[str]) -> None:
        """HF appends a bos/eos/unk/pad token that neither tokenizer.json nor the declared added
        tokens hold as a new id, past the trained vocabulary: remembered, so check_fits can name it."""
        self.appended_specials = [
            f"{self._named[key].name}'s {key} {json.dumps(t)}" for key in _VOCAB_SPECIALS
            if key in self._named and (t := self.special[key]) is not None and t not in added
            and self.tok.token_to_id(t) is None]

    def _llama_post_processor(self, add_bos: bool, add_eos: bool, cfg_file: Path) -> None:
        """LlamaTokenizerFast.update_post_processor."""
        from tokenizers import processors

        bos, eos = self.special["bos_token"], self.special["eos_token"]
        if add_bos and bos is None:
            raise TokenizerError(f"{cfg_file} has add_bos_token = true but no bos_token")
        if add_eos and eos is None:
            raise TokenizerError(f"{cfg_file} has add_eos_token = true but no eos_token")
        single = f"{(bos + ':0 ') if add_bos else ''}$A:0{(' ' + eos + ':0') if add_eos else ''}"
        pair = f"{single}{(' ' + bos + ':1') if add_bos else ''} $B:1{(' ' + eos + ':1') if add_eos else ''}"
        special = []
        for on, t in ((add_bos, bos), (add_eos, eos)):
            if on:
                i = self.tok.token_to_id(t)
                if i is None:
                    raise TokenizerError(f"{cfg_file}: special token {t!r} is not in the vocabulary")
                special.append((t, i))
        self.tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)

    def _add_prefix_space(self, cfg: dict, cfg_file: Path, tokenizer_class: str | None) -> None:
        """tokenizer_config.json's add_prefix_space, as transformers applies it. PreTrainedTokenizerFast
        sets it, false where the key is missing, on a pre-tokenizer with the field at its top level
        (ByteLevel; not one inside a Sequence); null, which the pre-tokenizer cannot take, leaves it as
        it is. LlamaTokenizerFast, also the class of a config without tokenizer_class, given a value
        converts tokenizer.model instead of reading tokenizer.json: warned of."""
        from tokenizers import pre_tokenizers

        value = cfg.get("add_prefix_space", False)
        if value is not None and not isinstance(value, bool):
            raise TokenizerError(f"{cfg_file} has add_prefix_space = {json.dumps(value)}; expected true, false or null")
        if tokenizer_class in SLOW_PREFIX_SPACE_CLASSES:
            if cfg.get("add_prefix_space") is not None:
                # a warning, not a refusal: a tokenizer.json that transformers itself saved after that
                # rebuild keeps the key in tokenizer_config.json, and is then what transformers encodes with
                from salactl.output import warn_once     # here: rich, which it imports, draws from `random`

                d = str(cfg_file.parent)
                warn_once(f"{cfg_file} has add_prefix_space = {json.dumps(value)}, with which transformers rebuilds "
                          "LlamaTokenizerFast from the SentencePiece tokenizer.model; salactl reads tokenizer.json, "
                          "whose ids at a text's start may differ unless transformers wrote it; to make sure: "
                          f"python -c \"from transformers import AutoTokenizer as T; T.from_pretrained({d!r})"
                          f".save_pretrained({d!r})\"")
            return
        if value is None or self.tok.pre_tokenizer is None:
            return
        state = json.loads(self.tok.pre_tokenizer.__getstate__())
        if state.get("add_prefix_space", value) != value:
            kind = getattr(pre_tokenizers, state.pop("type"))
            state["add_prefix_space"] = value
            self.tok.pre_tokenizer = kind(**state)

    def _template_prefix(self) -> list[int]:
        """The ids default encoding puts before the text (from the post-processor)."""
        for probe in ("x", "Hello world", "a"):
            plain = self.tok.encode(probe, add_special_tokens=False).ids
            full = self.tok.encode(probe).ids
            if plain:
                for i in range(len(full) - len(plain) + 1):
                    if full[i:i + len(plain)] == plain:
                        return full[:i]
        return []

    def _continuation_anchors(self) -> tuple[tuple[str, list[int]], ...]:
        """The anchors (with their ids) that encode(continuation=True) tries; none for a tokenizer whose
        ids of a text do not depend on what precedes it. One that marks where a text starts (the "▁"
        of a SentencePiece-style Prepend normalizer or Metaspace pre-tokenizer, ByteLevel's
        add_prefix_space) encodes a word alone otherwise than after other text."""
        anchors = tuple((a, ids) for a in CONTINUATION_ANCHORS if (ids := self._plain(a)))
        marks = any(self._after_anchor(probe, anchors) not in (None, self._plain(probe)) for probe in ("a", "The"))
        return anchors if marks else ()

    def _plain(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def _after_anchor(self, text: str, anchors) -> list[int] | None:
        """`text`'s ids after the first anchor whose ids stay a prefix of the anchor's and the text's
        (the text's first token did not merge into it); None where none does."""
        for anchor, head in anchors:
            ids = self._plain(anchor + text)
            if ids[:len(head)] == head:
                return ids[len(head):]
        return None

    # ---------------------------------------------------------------- API
    def encode(self, text: str, add_special_tokens: bool = True, specials_as_text: bool = False,
               continuation: bool = False) -> list[int]:
        """Text to token ids, like HF `encode`: with whatever special tokens the post-processor adds
        (e.g. BOS, as `salactl run --prompt` encodes), or the text's ids alone with
        `add_special_tokens=False`. specials_as_text: a literal "<s>" or "</s>" in the text is
        tokenized as those characters, not as the special id (HF's split_special_tokens=True).
        continuation: the ids the text gets where it follows other text, without special tokens, so
        that pieces encoded one by one join as their text does: a tokenizer that marks a text's start
        (SentencePiece-style "▁") puts none there (the text's ids alone where no anchor holds)."""
        self.tok.encode_special_tokens = specials_as_text     # a flag of the HF object: set for this call only
        try:
            if continuation:
                ids = self._after_anchor(text, self._anchors)
                return self._plain(text) if ids is None else ids
            return self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        except TypeError:
            check_utf8(text)
            raise
        finally:
            self.tok.encode_special_tokens = False

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        """Token ids to text; special tokens (BOS, EOS, ...) are left out unless skip_special=False
        (HF's skip_special_tokens). Ids past the tokenizer's vocabulary give no text, as in HF (a
        model's vocabulary may pad past its tokenizer's); anything but a list of non-negative integer
        ids is a UsageError."""
        try:
            if len(ids) and max(ids) >= self.vocab_size:
                ids = [i for i in ids if i < self.vocab_size]     # also those past u32, which HF cannot take
            text = self.tok.decode(ids, skip_special_tokens=skip_special)
        except (TypeError, OverflowError):      # not a list of ints, or a negative one
            raise UsageError(self._bad_ids(ids)) from None
        return text

    @staticmethod
    def _bad_ids(ids) -> str:
        bad = next((i for i in ids if not is_int(i) or i < 0), None) \
            if isinstance(ids, (list, tuple)) else None
        if bad is None:
            return f"decode takes a list of token ids, got {ids!r}"[:200]
        return f"token ids must be non-negative integers, got {bad!r}"

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The chat text as HF `apply_chat_template(messages, add_generation_prompt, tokenize=False,
        **kwargs)`: kwargs are extra template variables (e.g. enable_thinking=False, tools=[...]), over
        the special tokens' and tools/documents' (None); tools pick a template named "tool_use" where
        the checkpoint has one. ChatML, which takes none (kwargs are a UsageError), when the checkpoint
        has no template (`has_chat_template`)."""
        return self._render(messages, add_generation_prompt, kwargs)

    def _render(self, messages: list[dict], add_generation_prompt: bool, variables: dict) -> str:
        if not self.chat_templates:
            if variables:
                raise UsageError(f"--chat-template-kwargs ({', '.join(variables)}) apply to the checkpoint's chat "
                                 "template, and it has none (--chat uses ChatML); drop them")
            return chatml(messages, add_generation_prompt)
        name = self._template_name(variables)
        if name not in self._compiled:
            self._compiled[name] = compile_template(*self.chat_templates[name])
        kw = {"tools": None, "documents": None, **{k: v for k, v in self.special.items() if v is not None}}
        if self.additional_special:
            kw["additional_special_tokens"] = list(self.additional_special)
        # one dict, not **kwargs: a variable may be named like a Python parameter (self, system, ...)
        kw.update(variables, add_generation_prompt=add_generation_prompt, messages=messages)
        return self._compiled[name](kw)

    def _template_name(self, variables: dict) -> str:
        return pick_template(self.chat_templates, variables.get("tools"), self.path.parent / "tokenizer_config.json")

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_templates)

    def chat_ids(self, user: str, system: str | None = None, template_kwargs: dict | None = None) -> list[int]:
        """Ids of a one-turn chat prompt (after a system message, when given): the rendered template
        tokenized without special tokens (the template supplies any BOS), as HF
        `apply_chat_template(..., tokenize=True, **template_kwargs)`. template_kwargs: the template's
        extra variables (`--chat-template-kwargs`), which may not set what chat_ids does (check_chat_kwargs)."""
        template_kwargs = {} if template_kwargs is None else template_kwargs
        check_chat_kwargs(template_kwargs)
        messages = ([] if system is None else [{"role": "system", "content": system}]) + \
            [{"role": "user", "content": user}]
        text = self._render(messages, True, template_kwargs)
        if not self.chat_templates:
            self._check_chatml_markers()
        ids = self.encode(text, add_special_tokens=False)
        if not ids:
            where = self.chat_templates[self._template_name(template_kwargs)][1]
            raise TokenizerError(f"the chat template of {where} rendered no text for the prompt; fix the template, "
                                 "or run without --chat")
        return ids

    def _check_chatml_markers(self) -> None:
        """The ChatML fallback is only ChatML where its markers are single tokens; else they would be
        encoded as text the model never saw as markers."""
        if any(len(self.encode(m, add_special_tokens=False)) != 1 for m in CHATML_MARKERS):
            raise TokenizerError("the checkpoint has no chat template and its tokenizer lacks the ChatML markers "
                                 f"{'/'.join(CHATML_MARKERS)} as single tokens, so --chat cannot format the prompt; "
                                 "pass the prompt without --chat, or add a chat_template (chat_template.jinja "
                                 "or tokenizer_config.json's chat_template)")


def check_chat_kwargs(kwargs: dict) -> None:
    """The template's variables: a dict of names, less those that chat_ids (`--chat`) sets itself:
    it builds the messages and always asks for the generation prompt."""
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise UsageError(f"template_kwargs must be a dict of template variables by name, e.g. "
                         f"{{'enable_thinking': False}}, got {kwargs!r}"[:200])
    own = [k for k in ("messages", "add_generation_prompt") if k in kwargs]
    if own:
        raise UsageError(f"--chat-template-kwargs cannot set {' or '.join(own)}: --chat builds the messages "
                         f"(--system, then the prompt) and always asks for the generation prompt; drop "
                         f"{'it' if len(own) == 1 else 'them'}")


def _require_normal_tokens(tok, file: Path) -> None:
    """A tokenizer.json whose vocabulary is only special tokens encodes every text to nothing."""
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    if not set(tok.get_vocab(with_added_tokens=True)) - specials:
        raise TokenizerError(f"{file} has no tokens besides its special tokens (an empty vocabulary); "
                             "re-download the model's tokenizer.json or pass --tokenizer")


def _refuse_sentencepiece(file: Path) -> None:
    """`file`, the tokenizer.json looked for, is a SentencePiece tokenizer.model, or missing beside
    one: say that salactl reads only tokenizer.json, and how transformers converts the model."""
    spm = file if file.suffix == ".model" else file.parent / "tokenizer.model"
    found = lookup(spm, TokenizerError)
    if found and stat.S_ISREG(found.st_mode) and (file == spm or not lookup(file, TokenizerError)):
        d = str(spm.parent)
        raise TokenizerError(f"{spm} is a SentencePiece model, but salactl reads only tokenizer.json; convert it: "
                             f"python -c \"from transformers import AutoTokenizer as T; T.from_pretrained({d!r})"
                             f".save_pretrained({d!r})\"")


def _read_tokenizer_json(file: Path) -> str:
    """The text of tokenizer.json. An unreadable file is not an invalid one: say which it is. A device
    or FIFO would be read forever or block: refused first; one over MAX_TOKENIZER_FILE (also one that
    grows past it while read) too, since it is held whole."""
    fix = "re-download the model's tokenizer.json or pass another --tokenizer"
    chunks, total = [], 0
    try:
        check_regular_file(file, TokenizerError, MAX_TOKENIZER_FILE, fix)
        with open(file, "rb") as f:
            while chunk := f.read(min(_READ_CHUNK, MAX_TOKENIZER_FILE + 1 - total)):   # read(n) allocates n
                chunks.append(chunk)
                total += len(chunk)
    except OSError as e:
        raise TokenizerError(f"cannot read tokenizer {file}: {e.strerror}; fix its permissions or pass "
                             "another --tokenizer") from None
    if total > MAX_TOKENIZER_FILE:
        raise TokenizerError(f"{file} is over the {MAX_TOKENIZER_FILE // 2**20} MiB a tokenizer.json may have; {fix}")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{file} is not a valid tokenizer.json (not UTF-8: byte 0x{e.object[e.start]:02x} "
                             f"at offset {e.start}); {fix}") from None


def check_utf8(text) -> None:
    """A UsageError where `text` (a str; anything else is left to its caller) holds a lone surrogate."""
    if not isinstance(text, str) or (bad := lone_surrogate_at(text)) is None:
        return
    byte = ord(text[bad]) - 0xDC00
    shown = f"byte 0x{byte:02x}" if 0x80 <= byte <= 0xFF else f"code point U+{ord(text[bad]):04X}"
    raise UsageError(f"the text is not valid UTF-8 ({shown} at character offset {bad}); give UTF-8 text "
                     "(convert it, e.g. with iconv -f latin1 -t utf-8, or set a UTF-8 locale)")


def _int(v, path: Path) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise TokenizerError(f"{path} has a token id {json.dumps(v)}; expected an integer") from None


def _read_json(path: Path) -> dict:
    """tokenizer_config.json is optional, but one that is there must be a readable JSON object."""
    d = read_optional_json(path, TokenizerError, missing={})
    if not isinstance(d, dict):
        raise TokenizerError(f"{path} must hold a JSON object, not a {type(d).__name__}; fix or remove it")
    return d


def _token(cfg: dict, key: str, path: Path) -> str | None:
    """A special token: a string, an AddedToken object with a 'content' string, or null."""
    v = cfg.get(key)
    token = v.get("content") if isinstance(v, dict) else v
    if token is not None and not isinstance(token, str):
        raise TokenizerError(f"{path} has {key} = {json.dumps(v)}; expected a token string such as \"<s>\" "
                             "(or an object with a 'content' string)")
    return token


def find_tokenizer(explicit: str | None, model_dir: str | Path | None) -> Tokenizer:
    """The Tokenizer for a model: `explicit` (a tokenizer.json or its directory; --tokenizer), else
    the checkpoint's own tokenizer.json in model_dir (LoadedModel.model_dir). Only a model without
    a directory (a preset with random weights) falls back to the embedded sala-nano tokenizer: a
    checkpoint without its tokenizer is an error, since another vocabulary would silently give
    wrong ids."""
    if explicit is not None:
        _check_path(explicit, "explicit (--tokenizer: a tokenizer.json or its directory)")
    if explicit:
        return Tokenizer(explicit)
    if model_dir is not None:
        _check_path(model_dir, "model_dir (the checkpoint's directory)")
        model_dir = Path(model_dir)
        _refuse_sentencepiece(model_dir / "tokenizer.json")
        if not lookup(model_dir / "tokenizer.json", TokenizerError):
            raise TokenizerError(f"checkpoint {model_dir} has no tokenizer.json; pass --tokenizer PATH "
                                 "(the model's tokenizer.json or its directory)")
        return Tokenizer(model_dir)
    from salactl.runtime.loader import EMBEDDED_DIR

    return Tokenizer(EMBEDDED_DIR)


def _check_path(value, what: str) -> None:
    if not isinstance(value, (str, os.PathLike)):
        raise UsageError(f"{what} must be a path (a str or Path), got {type(value).__name__}")


def check_fits(tok: Tokenizer, vocab_size: int) -> None:
    """A tokenizer with more ids than the model's embedding would index past it."""
    if tok.vocab_size > vocab_size:
        why = (f" ({', '.join(tok.appended_specials)} is not in tokenizer.json, so it was added as a new id)"
               if tok.appended_specials else "")
        raise TokenizerError(f"tokenizer has {tok.vocab_size} tokens but the model only {vocab_size}{why}; "
                             "pass the model's own --tokenizer")
