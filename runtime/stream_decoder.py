"""Incremental detokenization: generated ids to text increments whose concatenation equals
`Tokenizer.decode(all ids)` (after the prompt's, given one), decoding only a short window of recent
ids (HF TextStreamer / vLLM);
GeneratedText ends that text at stop strings and stop ids, as vLLM does.
Hand-written, not `tokenizers.decoders.DecodeStream`: that arrived in tokenizers 0.21 (pyproject
allows 0.20), and it has no flush, so an output cut mid-character never gives the U+FFFD that
decode() ends in: the increments would not join to decode(ids)."""

from __future__ import annotations

import codecs
import json
import re

from salactl.errors import UsageError
from salactl.runtime.sampling import as_token_ids, is_int
from salactl.runtime.tokenizer import Tokenizer, check_utf8

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte <-> printable character table (the ByteLevel decoder's inverse)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _decoder_kinds(tok) -> set[str]:
    try:
        state = json.loads(tok.decoder.__getstate__()) if tok.decoder is not None else {}
    except Exception:
        return set()
    kinds, todo = set(), [state]
    while todo:
        d = todo.pop()
        if isinstance(d, dict):
            kinds.add(d.get("type"))
            todo.extend(d.get("decoders") or [])
    return kinds


class StreamDecoder:
    """Turns a growing list of ids into text increments: each push decodes only a short window of
    recent ids from a prefix offset (HF TextStreamer / vLLM incremental detokenization) and holds
    text back only while it may still change:
    - ByteLevel decoders: while the bytes end in an incomplete UTF-8 sequence;
    - ByteFallback decoders: while the last token is a <0xXX> byte token, since the decoder turns a
      whole run of byte tokens into U+FFFD per byte when any of it is invalid UTF-8;
    - other decoders: while the text ends in U+FFFD.
    `flush()` returns what is held at the end; all increments joined equal `decode(ids)`.

    prompt_ids (the request's prompt: a list or a 1-D tensor/array of ids) primes the decoder as
    vLLM's does: a short suffix of it starts `ids`, and the increments joined are what `decode(ids)`
    adds to the suffix's text. A Llama/SentencePiece decoder strips the leading space of the first
    token it decodes; decoded after the prompt, the first generated token keeps it, as vLLM and
    SGLang return it. Where the prompt's last ids are unsettled by the test above (a cut character;
    for ByteFallback, any byte-token run), their text stays the prompt's while the generated ids
    leave it as it is: no ids, or ids adding no text, give "" (as in vLLM), and a prompt cut
    mid-character followed by "A" gives "A" (vLLM: "\ufffdA"). Where the generated ids change it,
    the text from the change on counts as generated: a character the prompt cuts and the output
    completes shows whole, as in vLLM.

    decoder = StreamDecoder(tokenizer, prompt_ids=ids); print(decoder.push(token_id), end="") per
    generated id, then print(decoder.flush())."""

    def __init__(self, tokenizer: Tokenizer, *, prompt_ids=None):
        if not isinstance(tokenizer, Tokenizer):
            raise UsageError(f"tokenizer must be a Tokenizer (find_tokenizer(...) gives one), got "
                             f"{type(tokenizer).__name__}")
        self.tokenizer, self._chunks = tokenizer, []
        kinds = _decoder_kinds(tokenizer.tok)
        self._mode = "bytelevel" if "ByteLevel" in kinds else "bytefallback" if "ByteFallback" in kinds else "text"
        self._char_bytes = _bytes_to_unicode() if self._mode == "bytelevel" else None
        self._skipped = {i for i, t in tokenizer.tok.get_added_tokens_decoder().items() if t.special}
        self._added = {i: t.content for i, t in tokenizer.tok.get_added_tokens_decoder().items()}
        self.ids = _prompt_suffix(tokenizer, prompt_ids)
        self.prefix_offset, self.read_offset = 0, self._settled_length(self.ids)
        self._base = tokenizer.decode(self.ids[:self.read_offset])     # the primer's text, not emitted
        # while nothing is emitted: the texts of the whole primer and of its shorter prefixes through
        # its unsettled tail that end at a character boundary, longest first (see _prefix)
        self._primer = [tokenizer.decode(self.ids[:n]) for n in range(len(self.ids), self.read_offset, -1)
                        if n == len(self.ids) or not self._cut(self.ids[:n])]

    @property
    def emitted(self) -> str:
        return "".join(self._chunks)

    def _token_bytes(self, i: int) -> bytes:
        if i in self._added:
            return self._added[i].encode("utf-8")
        piece = self.tokenizer.tok.id_to_token(i) or ""
        if self._mode == "bytefallback":
            return bytes([int(m[1], 16)]) if (m := _BYTE_TOKEN.match(piece)) else piece.encode("utf-8")
        cb = self._char_bytes
        return b"".join(bytes([cb[c]]) if c in cb else c.encode("utf-8") for c in piece)

    def _cut(self, ids: list[int], text: str | None = None) -> bool:
        """Whether `ids` end inside a character: their bytes end in an incomplete UTF-8 sequence (other
        decoders: their text, `text` or decoded here, ends in U+FFFD)."""
        if self._mode == "text":
            return (self.tokenizer.decode(ids) if text is None else text).endswith("\ufffd")
        tail = b""
        for i in reversed(ids):
            if i not in self._skipped:
                tail = self._token_bytes(i) + tail
                if len(tail) >= 4:
                    break
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        dec.decode(tail[-4:], final=False)
        return bool(dec.getstate()[0])             # bytes buffered: an incomplete character

    def _unsettled(self, ids: list[int], text: str | None = None) -> bool:
        """Whether the text of `ids` (`text`, decoded here if None) may still change with the next ids."""
        if self._mode == "bytefallback":
            ids = [i for i in ids if i not in self._skipped]
            return bool(ids) and _BYTE_TOKEN.match(self.tokenizer.tok.id_to_token(ids[-1]) or "") is not None
        return self._cut(ids, text)

    def _settled_length(self, ids: list[int]) -> int:
        """How many of `ids` (a primer) are settled; the unsettled tail (a cut character) is left to the
        generated ids that may complete it, as vLLM's priming leaves it. Decided by the ids, not by a
        U+FFFD in the text: a prompt may end in a literal one."""
        n = len(ids)
        while n and self._unsettled(ids[:n]):
            n -= 1
        return n

    def _prefix(self, text: str) -> str:
        """The text of the window's ids before read_offset; before the first increment, the longest
        of self._primer that `text` starts with: that much is the prompt's text, the rest generated.
        A byte run decodes as a whole (U+FFFD per byte where any of it is invalid), so the prompt's
        "中" and half of "文" decode as 5 U+FFFD; the output's last byte of "文" then gives "文"."""
        for p in self._primer:
            if text.startswith(p):
                return p
        return self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])

    def push(self, token_id: int) -> str:
        """Add one generated id; returns the text it settles ("" while the text may still change).
        An id past the tokenizer's vocabulary (a model's padding rows) has no text, as in HF decode."""
        _check_token_id(token_id)
        if token_id >= self.tokenizer.vocab_size:
            return ""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids[self.prefix_offset:])
        prefix = self._prefix(text)
        if len(text) <= len(prefix) or not text.startswith(prefix) or \
                self._unsettled(self.ids[self.prefix_offset:], text):
            return ""
        new = text[len(prefix):]
        if self._primer:
            self._base, self._primer = prefix, []
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self._chunks.append(new)
        return new

    def flush(self) -> str:
        """The text still held (an incomplete character at the end of the output, say)."""
        full = self.tokenizer.decode(self.ids)
        done = self._prefix(full) if self._primer else self._base + self.emitted
        rest = full[len(done):] if full.startswith(done) else \
            self.tokenizer.decode(self.ids[self.prefix_offset:])[len(self.tokenizer.decode(
                self.ids[self.prefix_offset:self.read_offset])):]
        self.prefix_offset, self.read_offset, self._primer = len(self.ids), len(self.ids), []
        if rest:
            self._chunks.append(rest)
        return rest


# vLLM primes its detokenizer with the shortest prompt suffix of 4 to 23 ids that decodes without
# U+FFFD (a cut character); where none does, with the last 23 (vLLM: the whole prompt). Here the
# suffix must also decode as it does in the last 23: one starting inside a run of byte tokens that
# is invalid UTF-8 as a whole (every byte U+FFFD there) would show the output bytes that join the
# run turning the prompt's own bytes into U+FFFD
_PRIMER_IDS = range(4, 24)


def _prompt_suffix(tokenizer: Tokenizer, prompt_ids) -> list[int]:
    """The prompt's last ids that give the generated ids their context (none without a prompt)."""
    if isinstance(prompt_ids, (str, bytes)):
        raise UsageError(f"prompt_ids must be token ids (Tokenizer.encode gives them), got text {prompt_ids!r}"[:200])
    if is_int(prompt_ids) or getattr(prompt_ids, "ndim", 1) == 0:        # 5, np.int64(5), tensor(5)
        raise UsageError(f"prompt_ids must be a list or a 1-D tensor of token ids, got the scalar {prompt_ids!r}"[:200])
    if hasattr(prompt_ids, "tolist") and hasattr(prompt_ids, "ndim"):      # torch tensor, numpy array
        if prompt_ids.ndim != 1:
            raise UsageError(f"prompt_ids must be a list or a 1-D tensor of token ids, got shape "
                             f"{tuple(prompt_ids.shape)}")
        prompt_ids = prompt_ids[-_PRIMER_IDS[-1]:].tolist()
    try:
        prompt_ids = prompt_ids[-_PRIMER_IDS[-1]:]     # only these can prime it: a 1M-id prompt is not walked
    except TypeError:           # None, an iterator
        pass
    # ids past the tokenizer's vocabulary (a model's padding rows) have no text: push() skips them too
    ids = [i for i in as_token_ids(prompt_ids, "prompt_ids") if i < tokenizer.vocab_size]
    longest = tokenizer.decode(ids[-_PRIMER_IDS[-1]:])
    for n in _PRIMER_IDS:
        if n >= len(ids) or "\ufffd" not in (text := tokenizer.decode(ids[-n:])) and longest.endswith(text):
            return ids[-n:]
    return ids[-_PRIMER_IDS[-1]:]


def _check_token_id(value) -> None:
    if not is_int(value) or value < 0:
        raise UsageError(f"push takes a token id (an integer >= 0), got {value!r}"[:200])


def check_stop_strings(stop) -> tuple[str, ...]:
    """Stop strings as a tuple (None: none); an empty one (it would match at once), one that is not text or
    one that is not valid UTF-8 (bytes Python keeps as lone surrogates: the output is UTF-8) is a UsageError."""
    if stop is None:
        return ()
    try:
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
    except TypeError:
        raise UsageError(f"stop strings (--stop) must be text or a list of texts, got {stop!r}") from None
    for s in stop:
        if not isinstance(s, str) or not s:
            raise UsageError(f"stop strings (--stop) must be non-empty text, got {s!r}")
        try:
            check_utf8(s)
        except UsageError as e:
            raise UsageError(f"stop strings (--stop): {e}") from None
    return stop


class GeneratedText:
    """A generation's text as vLLM returns it (include_stop_str_in_output=False), built id by id
    through a StreamDecoder:
    - it ends at a stop string as vLLM's check_stop_strings ends it, and the caller ends generation
      once `stopped` (`stop_reason` then names the string): after each id, the `stop` strings are
      tried in the order given, each searched from len(string) - 1 characters before the id's text;
      the first found wins, even where one listed after it starts earlier, cut at its first
      occurrence there (a string completed by an earlier id has ended it already);
    - the text of an id in `stop_ids` (the EOS or stop id that ended generation) is left out; the
      id itself stays in the output ids;
    - push() returns the text that can be shown now, holding back the last len(longest stop) - 1
      characters, which the next ids may turn into a stop string; flush() returns the rest;
    - min_new_tokens (the request's SamplingParams.min_new_tokens) holds the stop strings back as
      vLLM's min_tokens does: only a match that ends in the text of a later id ends it.
    `text` is all that push() and flush() returned. stop_ids: a token id, ids or None (none).
    prompt_ids: the request's prompt, which the text is decoded after, as StreamDecoder's says.

        text = GeneratedText(tokenizer, stop=["\\n\\n"], stop_ids=eos_ids, prompt_ids=ids,
                             min_new_tokens=params.min_new_tokens)
        for t in engine.stream(ids, params, eos_ids=eos_ids):
            print(text.push(t), end="")
            if text.stopped:
                break
        print(text.flush())"""

    def __init__(self, tokenizer, stop=(), stop_ids=(), *, prompt_ids=None, min_new_tokens=0):
        self.stop = check_stop_strings(stop)
        self.stop_ids = frozenset(as_token_ids(stop_ids, "stop_ids"))
        if not is_int(min_new_tokens) or min_new_tokens < 0:
            raise UsageError(f"min_new_tokens (--min-new-tokens) must be an integer >= 0, got "
                             f"{min_new_tokens!r}"[:200])
        self.min_new_tokens = min_new_tokens
        self.stop_reason: str | None = None
        self._decoder = StreamDecoder(tokenizer, prompt_ids=prompt_ids)
        self._hold = max(map(len, self.stop), default=1) - 1
        self._text = ""            # the settled text, cut before the stop string once one appeared
        self._shown = 0            # characters of it returned so far
        self._pushed = 0           # ids pushed (a stop id not counted: it ends the generation)

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    @property
    def text(self) -> str:
        return self._text[:self._shown]

    def push(self, token_id: int) -> str:
        """Add one generated id; returns the text that can be shown now (often "")."""
        _check_token_id(token_id)
        if self.stopped or token_id in self.stop_ids:
            return ""
        self._pushed += 1
        self._append(self._decoder.push(token_id))
        return self._show(0 if self.stopped else self._hold)

    def flush(self) -> str:
        """The text not shown yet, at the end of the generation."""
        if not self.stopped:
            self._append(self._decoder.flush())
        return self._show(0)

    def _append(self, new: str) -> None:
        if not new:
            return
        before = len(self._text)
        self._text += new
        # vLLM's min_tokens (its v1 detokenizer, vllm#22014): stop strings are looked for only once
        # more than min_tokens ids are out, so only a match ending in the text of a later id counts
        # (one ending in the min_tokens-th id's own text does not, as EOS cannot be that id); it may
        # begin before, so the held-back tail still holds len(stop) - 1 characters
        if self._pushed <= self.min_new_tokens:
            return
        for s in self.stop:
            # list order, not position, picks the string, as in vLLM: a match that ends in `new`
            index = self._text.find(s, max(before - len(s) + 1, 0))
            if index >= 0:
                self.stop_reason, self._text = s, self._text[:index]
                return

    def _show(self, hold: int) -> str:
        end = max(len(self._text) - hold, self._shown)
        new, self._shown = self._text[self._shown:end], end
        return new
