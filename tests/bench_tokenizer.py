"""A small real BPE tokenizer.json (HF `tokenizers`), trained in the test's temp dir."""

from pathlib import Path

TEXTS = ["the quick brown fox jumps over the lazy dog", "def fibonacci(n): return n",
         "benchmark the server with long prompts and short answers"] * 20


def make_tokenizer(directory: Path, vocab_size: int = 300) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory
