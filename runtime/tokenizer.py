"""Tokenizer: HF `tokenizers` (tokenizer.json) with the checkpoint's special tokens and an
optional ChatML template (`<|im_start|>role\\n…<|im_end|>\\n`)."""

from __future__ import annotations

import json
from pathlib import Path

from salactl.errors import TokenizerError


class Tokenizer:
    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise TokenizerError(f"no tokenizer.json at {file}; pass --tokenizer PATH (a tokenizer.json or "
                                 "its directory)")
        try:
            self.tok = HFTokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises plain Exceptions for bad files
            raise TokenizerError(f"{file} is not a valid tokenizer.json ({str(e).splitlines()[0]})") from None
        self.path = file
        cfg_file = file.parent / "tokenizer_config.json"
        cfg = _read_json(cfg_file)
        add_bos = cfg.get("add_bos_token", True)
        if add_bos is not None and not isinstance(add_bos, bool):
            raise TokenizerError(f"{cfg_file} has add_bos_token = {json.dumps(add_bos)}; expected true or false")
        self.add_bos = bool(add_bos)
        self.bos_id = self._id(_token(cfg, "bos_token", cfg_file), "<s>")
        self.eos_ids = tuple(i for i in (self._id(_token(cfg, "eos_token", cfg_file), "</s>"),
                                         self._id(None, "<|im_end|>")) if i is not None)

    def _id(self, token, default):
        return self.tok.token_to_id(token or default)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special)

    def chat_prompt(self, user: str, system: str | None = None) -> str:
        parts = []
        if system:
            parts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
        parts.append(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
        return "".join(parts)


class StreamDecoder:
    """Turns a growing list of ids into text increments without splitting multi-byte characters."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer, self.ids, self.emitted = tokenizer, [], ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        new, self.emitted = text[len(self.emitted):], text
        return new


def _read_json(path: Path) -> dict:
    """tokenizer_config.json is optional, but one that is there must be a JSON object."""
    try:
        d = json.loads(path.read_text())
    except OSError:
        return {}
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); fix or remove it") from None
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


def find_tokenizer(explicit: str | None, model_dir: Path | None) -> Tokenizer:
    """--tokenizer, else the checkpoint's own tokenizer.json. Only a model without a directory (a
    preset with random weights) falls back to the embedded sala-nano tokenizer: a checkpoint
    without its tokenizer is an error, since another vocabulary would silently give wrong ids."""
    if explicit:
        return Tokenizer(Path(explicit))
    if model_dir is not None:
        if not (model_dir / "tokenizer.json").exists():
            raise TokenizerError(f"checkpoint {model_dir} has no tokenizer.json; pass --tokenizer PATH "
                                 "(the model's tokenizer.json or its directory)")
        return Tokenizer(model_dir)
    from salactl.runtime.loader import EMBEDDED_DIR

    return Tokenizer(EMBEDDED_DIR)
