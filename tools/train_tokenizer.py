"""Train the sala-nano byte-level BPE tokenizer on the corpus train split (CPU, ~1 minute).

    python tools/train_tokenizer.py [--vocab-size 4096] [--out runtime/models/sala-nano]

Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json. Digits are split one per
token (so a number is copied digit by digit, which the passkey task needs); special tokens take
ids 0-4 in the order of SPECIAL_TOKENS. The tokenizer is committed, so the GPU training run only
trains the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # noqa: E402 (runs from a checkout without installing)

from salactl.data.corpus import corpus_documents, corpus_sha256, python_version  # noqa: E402

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus_documents("train"), trainer=trainer)
    return tok


def tokenizer_config(max_len: int) -> dict:
    return {
        # LlamaTokenizerFast: HF then adds <s> per add_bos_token (the model is trained with it);
        # PreTrainedTokenizerFast would ignore add_bos_token (tokenizer.json has no post-processor)
        "tokenizer_class": "LlamaTokenizerFast",
        "legacy": True,                 # LlamaTokenizerFast's default, stated to silence its warning
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": t, "special": True, "lstrip": False,
                                          "rstrip": False, "normalized": False, "single_word": False}
                                 for i, t in enumerate(SPECIAL_TOKENS)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--max-len", type=int, default=65536)
    ap.add_argument("--out", type=Path, default=REPO / "runtime" / "models" / "sala-nano")
    args = ap.parse_args()
    tok = build_tokenizer(args.vocab_size)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"))
    (args.out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(args.max_len), indent=2) + "\n")
    (args.out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>", "unk_token": "<unk>",
         "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]}, indent=2) + "\n")
    print(json.dumps({"vocab_size": tok.get_vocab_size(), "python": python_version(),
                      "train_corpus_sha256": corpus_sha256("train"), "out": str(args.out)}))


if __name__ == "__main__":
    main()
