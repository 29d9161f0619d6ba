"""quantize of an in-memory float32 model (random weights, or a LoadedModel) writes its unquantized
tensors in the checkpoint's declared dtype (config.json's torch_dtype, bfloat16 for sala-nano), not
in the float32 it computed in: what SGLang/vLLM load, at half the bytes."""

import json

import torch

from salactl.quant.api import quantize_checkpoint
from salactl.quant.sequential import QuantOptions
from salactl.runtime.checkpoint import expected_tensor_shapes
from salactl.runtime.loader import load_model
from test_quantize_cli import _tensors

RTN = QuantOptions(method="rtn")


def _assert_unquantized_tensors_are_bf16(out, config):
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    t = _tensors(out)
    plain = [n for n in expected_tensor_shapes(config) if n in t]
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= set(plain)
    assert any(".input_layernorm." in n for n in plain)
    assert {n: t[n].dtype for n in plain} == {n: torch.bfloat16 for n in plain}


def test_random_weights_quantized_in_float32_are_written_in_bfloat16(tmp_path):
    out = tmp_path / "q"
    quantize_checkpoint("sala-nano", out, RTN, random_weights=True, device="cpu", dtype="float32")
    _assert_unquantized_tensors_are_bf16(out, load_model("sala-nano", "cpu", random_weights=True).config)


def test_a_float32_loaded_model_is_written_in_bfloat16(tmp_path):
    lm = load_model("sala-nano", "cpu", "float32")
    assert lm.config.torch_dtype == "bfloat16" and lm.model.model.embed_tokens.weight.dtype == torch.float32
    out = tmp_path / "q"
    quantize_checkpoint(lm, out, RTN, device="cpu", dtype="float32")
    _assert_unquantized_tensors_are_bf16(out, lm.config)
