"""4-bit GPTQ linears whose out_features are not a multiple of 16: torch's int4 CPU op and our
Triton layout tile 16 output rows, so before they were padded the CPU load crashed ("expect N to be
dividable by 16") and CUDA fell back to dequantizing the whole weight in fp32 on every call.
MiniCPM-SALA's vocabulary, 73448 = 16 x 4590 + 8, is one: a GPTQ checkpoint with a quantized lm_head
(GPTQModel's lm_head=true)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from salactl.quant.linear import GPTQLinear
from salactl.quant.packing import to_gptq_tensors
from salactl.quant.quantizer import QuantSpec
from salactl.quant.rtn import rtn_quantize
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.engine import Engine
from salactl.runtime.loader import EMBEDDED_DIR, build_model, load_model
from salactl.runtime.presets import sala_nano
from conftest import gpu, rel_err, run_cli


@pytest.mark.parametrize("n,k,group", [(8, 32, 32), (24, 64, 32), (40, 128, -1), (4104, 64, 64)])
def test_cpu_int4_takes_out_features_that_are_not_a_multiple_of_16(n, k, group, rng):
    w = torch.randn(n, k, generator=rng) * 0.05
    q = rtn_quantize(w, QuantSpec(4, group))
    t = to_gptq_tensors(q.codes, q.scales, q.g_idx, 4)
    lin = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 4, group, "cpu", torch.float32)
    assert lin.layout == "cpu_int4"
    x = torch.randn(2, 3, k, generator=rng)
    y = lin(x)
    assert y.shape == (2, 3, n)
    assert rel_err(y, x @ q.dequantized.t()) < 1e-2            # bf16 activations
    assert lin.dequantized_weight().shape == (n, k)
    assert rel_err(lin.dequantized_weight(), q.dequantized) < 1e-2      # bf16 scales


@pytest.fixture(scope="module")
def lm_head_w4(tmp_path_factory):
    """sala-nano's shapes with a vocabulary of 4104 (8 past a multiple of 16, as 73448), every linear
    and lm_head quantized to 4-bit g64; and the float model of the same dequantized weights."""
    cfg = sala_nano(vocab_size=4104)
    state = random_state_dict(cfg, "cpu", torch.float32, seed=3)
    tensors, dequantized = {}, {}
    for name, w in state.items():
        if w.dim() == 2 and "embed_tokens" not in name:
            q = rtn_quantize(w, QuantSpec(4, 64))
            prefix = name.removesuffix(".weight")
            tensors.update({f"{prefix}.{k}": v for k, v in to_gptq_tensors(q.codes, q.scales, q.g_idx, 4).items()})
            dequantized[name] = q.dequantized
        else:
            tensors[name] = w.to(torch.bfloat16)
            dequantized[name] = tensors[name].float()
    out = tmp_path_factory.mktemp("w4") / "lm-head-w4"
    out.mkdir()
    hf = cfg.to_hf_dict()
    hf["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False, "sym": True,
                                 "lm_head": True, "checkpoint_format": "gptq"}
    (out / "config.json").write_text(json.dumps(hf))
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EMBEDDED_DIR / f, out / f)
    return out, build_model(cfg, dequantized)


def test_a_quantized_lm_head_of_such_a_vocabulary_loads_and_computes_the_dequantized_model(lm_head_w4, capsys):
    path, reference = lm_head_w4
    ids = list(range(1, 40))
    lm = load_model(path, device="cpu", dtype="fp32")
    assert lm.model.lm_head.layout == "cpu_int4" and lm.model.lm_head.out_features == 4104
    got = Engine(lm).prefill(Engine(lm).new_sequence(), ids, all_logits=True)
    want = Engine(reference).prefill(Engine(reference).new_sequence(), ids, all_logits=True)
    assert got.shape == want.shape == (len(ids), 4104)
    assert rel_err(got, want) < 5e-2           # bf16 activations through 8 random layers; wrong rows: O(1)
    code, out, err = run_cli(["run", "--model", path, "--prompt-ids", "1,5,9", "-n", 2, "--json"], capsys)
    assert code == 0, err
    assert len(json.loads(out)["output_token_ids"]) == 2


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("n,k,group", [(8, 128, 128), (24, 256, 64), (4104, 512, 128), (40, 128, -1)])
def test_the_triton_layout_takes_out_features_that_are_not_a_multiple_of_16(n, k, group, rng):
    w = torch.randn(n, k, generator=rng) * 0.05
    q = rtn_quantize(w, QuantSpec(4, group))
    t = to_gptq_tensors(q.codes, q.scales, q.g_idx, 4)
    lin = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 4, group, "cuda", torch.bfloat16)
    assert lin.layout == "triton" and lin.padded_rows() == -n % 16
    assert rel_err(lin.dequantized_weight().cpu(), q.dequantized) < 1e-3          # fp16 scales
    for rows in (1, 8, 40):                     # GEMV / skinny / tiled GEMM
        x = torch.randn(rows, k, generator=rng).to(torch.bfloat16)
        y = lin(x.cuda())
        assert y.shape == (rows, n)
        assert rel_err(y.float().cpu(), x.float() @ q.dequantized.t()) < 1e-2
    if n % 2 == 0:                              # [gate | up] rows: the GLU falls back to forward + silu·mul
        x = torch.randn(3, k, generator=rng).to(torch.bfloat16)
        full = x.float() @ q.dequantized.t()
        want = torch.nn.functional.silu(full[:, :n // 2]) * full[:, n // 2:]
        assert rel_err(lin.forward_glu(x.cuda()).float().cpu(), want) < 2e-2


@pytest.mark.gpu
@gpu
def test_a_quantized_lm_head_of_such_a_vocabulary_runs_on_the_gpu_engine(lm_head_w4, capsys):
    path, reference = lm_head_w4
    ids = list(range(1, 40))
    lm = load_model(path, device="cuda", dtype="bf16")
    assert lm.model.lm_head.layout == "triton" and lm.model.lm_head.padded_rows() == 8
    got = Engine(lm).prefill(Engine(lm).new_sequence(), ids, all_logits=True)
    want = Engine(reference).prefill(Engine(reference).new_sequence(), ids, all_logits=True)
    assert got.shape == (len(ids), 4104)
    assert rel_err(got.float().cpu(), want) < 5e-2
    code, out, err = run_cli(["run", "--model", path, "--device", "cuda", "--prompt-ids", "1,5,9", "-n", 2, "--json"],
                             capsys)
    assert code == 0, err
    assert len(json.loads(out)["output_token_ids"]) == 2
