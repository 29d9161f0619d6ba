"""The shipped sala-nano checkpoint: loads strictly, config validates, tokenizer specials, generates."""

import json

import torch

from salactl.runtime.checkpoint import expected_tensor_shapes, tensor_files
from salactl.runtime.config import SalaConfig
from salactl.runtime.engine import Engine
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from salactl.runtime.presets import sala_nano
from salactl.runtime.sampling import SamplingParams
from salactl.runtime.tokenizer import Tokenizer


def test_checkpoint_files_are_small_sharded_bf16_and_match_the_preset():
    cfg = SalaConfig.from_file(EMBEDDED_DIR / "config.json")
    assert cfg == sala_nano(vocab_size=cfg.vocab_size)
    raw = json.loads((EMBEDDED_DIR / "config.json").read_text())
    for key in ("mixer_types", "sparse_config", "lightning_nh", "scale_emb", "dim_model_base",
                "attn_use_output_gate", "use_output_gate", "qk_norm"):
        assert key in raw
    files = set(tensor_files(EMBEDDED_DIR).values())
    assert len(files) >= 2 and all(f.stat().st_size < 16 * 2 ** 20 for f in files)
    assert sum(f.stat().st_size for f in files) < 25e6
    from safetensors import safe_open
    with safe_open(sorted(files)[0], framework="pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.bfloat16
    gen = json.loads((EMBEDDED_DIR / "generation_config.json").read_text())
    assert gen["bos_token_id"] == cfg.bos_token_id and gen["eos_token_id"] == list(cfg.eos_token_id)


def test_tokenizer_special_tokens_agree_with_config():
    tok = Tokenizer(EMBEDDED_DIR)
    cfg = SalaConfig.from_file(EMBEDDED_DIR / "config.json")
    assert tok.vocab_size == cfg.vocab_size
    ids = {t: tok.tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")}
    assert ids == {"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_start|>": 3, "<|im_end|>": 4}
    assert tok.bos_id == cfg.bos_token_id and set(tok.eos_ids) == set(cfg.eos_token_id)
    assert tok.encode("x = 1")[0] == tok.bos_id
    assert tok.decode(tok.encode("def f(x):\n    return 42\n")) == "def f(x):\n    return 42\n"


def test_embedded_model_loads_strictly_and_continues_code():
    lm = load_model("sala-nano", "cpu", "float32")
    assert set(dict(lm.model.named_parameters())) == set(expected_tensor_shapes(lm.config))
    tok = Tokenizer(EMBEDDED_DIR)
    prompt = tok.encode("import os\nimport sys\n\n\ndef main():\n    ")
    res = Engine(lm.model, "cpu").generate(prompt, SamplingParams(max_new_tokens=24), eos_ids=tok.eos_ids)
    text = tok.decode(res.output_token_ids)
    # A trained model writes Python: identifiers and spaces, not random byte soup.
    assert len(text.strip()) > 10 and sum(c.isalnum() or c in " _.()=:\n\"'," for c in text) > 0.8 * len(text)
