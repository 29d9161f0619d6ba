"""GPTQModel's `pack_dtype` (int8/int16/int32/int64) is the word qweight and qzeros are packed in.
A checkpoint packed in int16 words was refused with a qweight shape mismatch ("has shape [64, 768]
but ... imply [32, 768]") that never named the cause; it is now refused by its pack_dtype, and the
int32 that GPTQModel writes by default still loads."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from salactl.errors import CheckpointError
from salactl.quant.loading import parse_quant_config
from salactl.quant.packing import to_gptq_tensors
from salactl.quant.quantizer import QuantSpec
from salactl.quant.rtn import rtn_quantize
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from salactl.runtime.presets import sala_nano
from conftest import run_cli


def _int16_words(words: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 GPTQ words as GPTQModel packs them in int16: each word's low half first, along `dim`."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    halves = torch.stack([w & 0xFFFF, w >> 16], dim=dim + 1).flatten(dim, dim + 1)
    return torch.where(halves >= 2 ** 15, halves - 2 ** 16, halves).to(torch.int16)


def _write(ckpt, pack_dtype, words=lambda name, t: t) -> None:
    """sala-nano's shapes, random weights, every linear but lm_head quantized (4-bit g128, int32
    words, passed through `words`), with quantization_config.pack_dtype `pack_dtype`."""
    cfg = sala_nano()
    tensors = {}
    for name, w in random_state_dict(cfg, "cpu", torch.float32, seed=1).items():
        if w.dim() == 2 and "embed_tokens" not in name and name != "lm_head.weight":
            q = rtn_quantize(w, QuantSpec(4, 128))
            prefix = name.removesuffix(".weight")
            tensors.update({f"{prefix}.{k}": words(k, v) for k, v in to_gptq_tensors(q.codes, q.scales, q.g_idx,
                                                                                      4).items()})
        else:
            tensors[name] = w.to(torch.bfloat16)
    hf = cfg.to_hf_dict()
    hf["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
                                 "sym": True, "lm_head": False, "checkpoint_format": "gptq", "pack_dtype": pack_dtype}
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(hf))
    save_file({n: t.contiguous() for n, t in tensors.items()}, ckpt / "model.safetensors", metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EMBEDDED_DIR / f, ckpt / f)


def test_an_int16_packed_checkpoint_is_refused_by_its_pack_dtype(tmp_path, capsys):
    ckpt = tmp_path / "int16"
    dims = {"qweight": 0, "qzeros": 1}
    _write(ckpt, "int16", lambda k, t: _int16_words(t, dims[k]) if k in dims else t)
    msg = 'quantization_config.pack_dtype "int16" is not supported'
    with pytest.raises(CheckpointError, match=msg):
        load_model(ckpt, device="cpu")
    code, out, err = run_cli(["run", "--model", ckpt, "--prompt-ids", "1,2", "-n", 1, "--json"], capsys)
    assert code == 4 and out == "" and err.count("\n") == 1 and msg in err and "int32" in err, err


def test_int32_words_load_as_before(tmp_path):
    _write(tmp_path / "int32", "int32")
    lm = load_model(tmp_path / "int32", device="cpu")
    assert lm.model.model.layers[0].mlp.down_proj.bits == 4
    qc = json.loads((tmp_path / "int32" / "config.json").read_text())["quantization_config"]
    assert parse_quant_config({**qc, "pack_dtype": None}) == parse_quant_config(qc)


@pytest.mark.parametrize("value", ["int8", "int64", "torch.int16", 32])
def test_every_other_pack_dtype_is_refused(value):
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "pack_dtype": value}
    with pytest.raises(CheckpointError, match="pack_dtype .* is not supported"):
        parse_quant_config(qc)
