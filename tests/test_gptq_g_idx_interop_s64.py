"""A GPTQ checkpoint whose g_idx is not k // group_size (act-order groups) while its config says
desc_act false: salactl computes with g_idx, but vLLM's and SGLang's GPTQ kernels read g_idx only
with desc_act true, so the checkpoint would serve other outputs there: loading warns once, naming
the module and the fix; the natural g_idx, or desc_act true, loads without a word."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from salactl.quant.packing import to_gptq_tensors
from salactl.quant.quantizer import QuantSpec
from salactl.quant.rtn import rtn_quantize
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from salactl.runtime.presets import sala_nano


def _checkpoint(out, permute: bool, desc_act: bool):
    cfg = sala_nano()
    state = random_state_dict(cfg, "cpu", torch.float32, seed=5)
    tensors = {}
    for name, w in state.items():
        if w.dim() == 2 and "embed_tokens" not in name and "lm_head" not in name:
            q = rtn_quantize(w, QuantSpec(4, 32))
            t = to_gptq_tensors(q.codes, q.scales, q.g_idx, 4)
            if permute and name == "model.layers.1.mlp.down_proj.weight":
                t["g_idx"] = t["g_idx"][torch.randperm(len(t["g_idx"]), generator=torch.Generator().manual_seed(0))]
            tensors.update({f"{name.removesuffix('.weight')}.{k}": v for k, v in t.items()})
        else:
            tensors[name] = w.to(torch.bfloat16)
    out.mkdir()
    hf = cfg.to_hf_dict()
    hf["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": desc_act,
                                 "sym": True, "checkpoint_format": "gptq"}
    (out / "config.json").write_text(json.dumps(hf))
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(EMBEDDED_DIR / "tokenizer.json", out / "tokenizer.json")
    return out


@pytest.mark.parametrize("permute,desc_act,warned", [(True, False, True), (True, True, False), (False, False, False)])
def test_act_order_g_idx_under_desc_act_false_warns_about_vllm_and_sglang(tmp_path, capfd, permute, desc_act, warned):
    path = _checkpoint(tmp_path / "ckpt", permute, desc_act)
    capfd.readouterr()
    load_model(path, device="cpu", dtype="fp32")
    err = capfd.readouterr().err
    if not warned:
        assert err == ""
        return
    assert err == (f"warning: {path}: model.layers.1.mlp.down_proj.g_idx is not k // group_size but "
                   "quantization_config.desc_act is false: salactl applies g_idx, while vLLM and SGLang read it "
                   "only with desc_act true and would serve other outputs; set \"desc_act\": true in its "
                   "quantization_config\n")
