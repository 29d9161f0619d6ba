"""GPTQ checkpoints as other tools write them (AutoGPTQ / GPTQModel / optimum / GPTQ-for-LLaMa), built
here by an independent packer, load with the logits of the same weights dequantized by hand into a
plain fp32 model; `salactl quantize` output dequantizes, by that same hand-written code, to the model
salactl loads. Nothing of salactl's GPTQ code (quant/) is used to build or read the tensors here.

Layout (reference/quantization.md §2): qweight int32 [K/v, N] with value j of a word in bits
b·j..b·j+b-1 (low bits first, v = 32/b); qzeros int32 [groups, N/v] holding zero-1 (v1 "gptq") or
zero (v2 "gptq_v2"); scales [groups, N]; g_idx int32 [K]. W[n, k] = s[g[k], n]·(q[k, n] - z[g[k], n]).

GPTQ-for-LLaMa's QuantLinear registers a zero `bias` buffer for every linear, so early GPTQ
checkpoints of bias-free models carry one per quantized linear (vLLM skips them): all-zero biases
load, a nonzero one is refused in one line."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import run_cli
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.config import LIGHTNING, SPARSE, SalaConfig, SparseConfig
from salactl.runtime.engine import Engine
from salactl.runtime.loader import build_model, load_model

IDS = [1, 5, 9, 17, 33, 65, 100, 3, 7, 11, 42, 2]


def tiny_config() -> SalaConfig:
    """Every linear fits Marlin's shape rules (in % 128, out % 64), so quantize quantizes them all."""
    return SalaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, mixer_types=(SPARSE, LIGHTNING),
                      lightning_nh=4, lightning_nkv=4, lightning_head_dim=32, dim_model_base=16, eos_token_id=(2,),
                      initializer_range=0.1,
                      sparse_config=SparseConfig(block_size=16, dense_len=40, init_blocks=1, kernel_size=8,
                                                 kernel_stride=4, topk=1, window_size=16))


# -- an independent GPTQ packer and dequantizer ---------------------------------------------------------

def _int32(words: torch.Tensor) -> torch.Tensor:
    words = words & 0xFFFFFFFF
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] values -> int32 [R*bits/32, C], value j of each word in bits bits*j.. (low first)."""
    v = 32 // bits
    vals = values.to(torch.int64).reshape(values.shape[0] // v, v, values.shape[1])
    words = torch.zeros(vals.shape[0], vals.shape[2], dtype=torch.int64)
    for j in range(v):
        words |= vals[:, j] << (bits * j)
    return _int32(words)


def unpack_rows(words: torch.Tensor, bits: int) -> torch.Tensor:
    w = words.to(torch.int64) & 0xFFFFFFFF
    parts = [(w >> (bits * j)) & (2 ** bits - 1) for j in range(32 // bits)]
    return torch.stack(parts, 1).reshape(w.shape[0] * 32 // bits, w.shape[1])


def dequantize(t: dict, bits: int, group: int, fmt: str) -> torch.Tensor:
    """fp32 [N, K] from one linear's qweight/qzeros/scales(/g_idx)."""
    q = unpack_rows(t["qweight"], bits)                                   # [K, N]
    z = unpack_rows(t["qzeros"].t().contiguous(), bits).t()               # [groups, N]
    z = z + 1 if fmt == "gptq" else z
    k = q.shape[0]
    g = t["g_idx"].long() if "g_idx" in t else torch.arange(k) // (k if group == -1 else group)
    return ((q - z[g]).double() * t["scales"].double()[g]).t().float()


def quantize(w: torch.Tensor, bits: int, g_idx: torch.Tensor, scale_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest of w [N, K] under g_idx: codes [K, N], scales [groups, N]."""
    maxq, groups = 2 ** bits - 1, int(g_idx.max()) + 1
    scales = torch.stack([w[:, g_idx == g].abs().amax(1).clamp(min=1e-4) * 2 / maxq for g in range(groups)])
    scales = scales.to(scale_dtype)
    s = scales.float()[g_idx.long()].t()
    codes = torch.clamp(torch.round(w / s) + 2 ** (bits - 1), 0, maxq).to(torch.int64)
    return codes.t().contiguous(), scales


def write_gptq(out: Path, bits=4, group=16, fmt="gptq", desc_act=False, scale_dtype=torch.float16, g_idx=True,
               standalone=False, shards=False, lm_head=False, bias=None, qc_extra=None) -> dict:
    """A GPTQ checkpoint of tiny_config's random weights as another tool writes it; returns the
    reference fp32 state dict (quantized linears dequantized by hand). bias: None, or the value every
    quantized linear's .bias holds."""
    cfg = tiny_config()
    gen = torch.Generator().manual_seed(1)
    tensors, ref = {}, {}
    for name, w in random_state_dict(cfg, "cpu", torch.float32, seed=3).items():
        if w.dim() != 2 or "embed" in name or ("lm_head" in name and not lm_head):
            tensors[name] = w.to(torch.bfloat16)
            ref[name] = tensors[name].float()
            continue
        n, k = w.shape
        gi = (torch.arange(k) // (k if group == -1 else group)).to(torch.int32)
        if desc_act:
            gi = gi[torch.randperm(k, generator=gen)]
        codes, scales = quantize(w, bits, gi, scale_dtype)
        zeros = torch.full((scales.shape[0], n), 2 ** (bits - 1) - (fmt == "gptq"), dtype=torch.int64)
        t = {"qweight": pack_rows(codes, bits), "qzeros": pack_rows(zeros.t().contiguous(), bits).t().contiguous(),
             "scales": scales}
        if g_idx:
            t["g_idx"] = gi
        if bias is not None:
            t["bias"] = torch.full((n,), bias, dtype=torch.float16)
        prefix = name.removesuffix(".weight")
        tensors.update({f"{prefix}.{key}": v for key, v in t.items()})
        ref[name] = dequantize({**t, "g_idx": gi}, bits, group, fmt)
    out.mkdir()
    qc = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": desc_act, "sym": True,
          "checkpoint_format": fmt, "lm_head": lm_head, **(qc_extra or {})}
    hf = cfg.to_hf_dict()
    if standalone:          # AutoGPTQ's quantize_config.json, without quant_method
        qc.pop("quant_method")
        (out / "quantize_config.json").write_text(json.dumps(qc))
    else:
        hf["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(hf))
    if not shards:
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
        return ref
    names = sorted(tensors)     # a linear's qweight and scales land in different shards
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, out / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return ref


def prefill_logits(model) -> torch.Tensor:
    engine = Engine(model, "cpu", chunk_size=512)
    return engine.prefill(engine.new_sequence(), IDS, all_logits=True)


def assert_logits_match(got: torch.Tensor, want: torch.Tensor, exact: bool) -> None:
    """exact: the fp32 dequantizing layout (summation order aside); else the CPU int4/int8 kernels,
    which run on bf16-rounded activations (W4A16/W8A16)."""
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel < (1e-5 if exact else 2e-2), rel


# -- other tools' checkpoints load as their hand-dequantized weights -----------------------------------

VARIANTS = {
    "v1": dict(),
    "v2": dict(fmt="gptq_v2"),
    "v1-act-order": dict(desc_act=True),
    "v1-act-order-int4-kernel": dict(group=32, desc_act=True),
    "v1-per-channel-act-order": dict(group=-1, desc_act=True),
    "bf16-scales": dict(scale_dtype=torch.bfloat16),
    "no-g_idx": dict(g_idx=False),
    "quantize_config.json-sharded": dict(standalone=True, shards=True),
    "lm_head-quantized": dict(lm_head=True),
    "informational-keys": dict(qc_extra={"true_sequential": True, "static_groups": False, "damp_percent": 0.05,
                                         "format": "gptq", "meta": {"quantizer": ["gptqmodel:7.7.0"]},
                                         "modules_in_block_to_quantize": [["self_attn.q_proj", "self_attn.k_proj"]]}),
    "zero-biases": dict(bias=0.0),
    "8bit-v1-act-order": dict(bits=8, group=32, desc_act=True),
    "8bit-v2-per-channel-zero-biases": dict(bits=8, group=-1, fmt="gptq_v2", bias=0.0),
}
EXACT = {"v1", "v2", "v1-act-order", "bf16-scales", "no-g_idx", "quantize_config.json-sharded",
         "lm_head-quantized", "informational-keys", "zero-biases"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_other_tools_checkpoints_load_as_their_hand_dequantized_weights(tmp_path, variant):
    ref = write_gptq(tmp_path / "ckpt", **VARIANTS[variant])
    want = prefill_logits(build_model(tiny_config(), ref))
    got = prefill_logits(load_model(tmp_path / "ckpt", "cpu", "fp32").model)
    assert_logits_match(got, want, exact=variant in EXACT)


def test_a_nonzero_bias_on_a_quantized_linear_is_refused_in_one_line(tmp_path, capsys):
    write_gptq(tmp_path / "ckpt", bias=0.0)
    with safe_open(tmp_path / "ckpt" / "model.safetensors", "pt") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    tensors["model.layers.1.self_attn.o_proj.bias"][3] = 0.5
    save_file(tensors, tmp_path / "ckpt" / "model.safetensors", metadata={"format": "pt"})
    code, out, err = run_cli(["run", "--model", tmp_path / "ckpt", "--prompt-ids", "1,2,3", "-n", "1",
                              "--device", "cpu"], capsys)
    assert (code, out) == (4, "")
    assert err.count("\n") == 1 and err.startswith("error: tensor model.layers.1.self_attn.o_proj.bias is a "
                                                   "nonzero bias"), err


# -- salactl quantize's output, read by the same hand-written code -------------------------------------

@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("src") / "float"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(tiny_config().to_hf_dict()))
    state = random_state_dict(tiny_config(), "cpu", torch.float32, seed=3)
    save_file({n: w.to(torch.bfloat16) for n, w in state.items()}, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("method,bits", [("rtn", 4), ("gptq", 8)])
def test_quantize_output_round_trips_through_an_independent_dequant(float_checkpoint, tmp_path, capsys, method, bits):
    out = tmp_path / "q"
    calib = ["--calib", "random", "--nsamples", "2", "--seqlen", "64"] if method == "gptq" else []
    code, _, err = run_cli(["quantize", "--model", float_checkpoint, "--out", out, "--method", method, "--bits", bits,
                            "--group-size", "32", *calib, "--json"], capsys)
    assert code == 0, err
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (qc["bits"], qc["group_size"], qc["sym"], qc["checkpoint_format"]) == (bits, 32, True, "gptq")
    with safe_open(out / "model.safetensors", "pt") as f:
        stored = {n: f.get_tensor(n) for n in f.keys()}
    with safe_open(float_checkpoint / "model.safetensors", "pt") as f:
        source = {n: f.get_tensor(n).float() for n in f.keys()}
    ref = {n: t.float() for n, t in stored.items() if n in source}
    symmetric = 0x77777777 if bits == 4 else 0x7F7F7F7F
    for prefix in [n.removesuffix(".qweight") for n in stored if n.endswith(".qweight")]:
        t = {key: stored[f"{prefix}.{key}"] for key in ("qweight", "qzeros", "scales", "g_idx")}
        assert bool((t["qzeros"] == symmetric).all()) and t["scales"].dtype == torch.float16
        assert torch.equal(t["g_idx"].long(), torch.arange(t["g_idx"].numel()) // 32)   # static groups
        w = dequantize(t, bits, 32, "gptq")
        if method == "rtn":     # each weight within half a step of its source (a little more where the
            step = t["scales"].float().repeat_interleave(32, 0).t()     # bf16-rounded scale clamps max-abs)
            assert bool(((w - source[prefix + ".weight"]).abs() <= 0.55 * step).all()), prefix
        ref[prefix + ".weight"] = w
    assert set(ref) == set(source)
    want = prefill_logits(build_model(tiny_config(), ref))
    got = prefill_logits(load_model(out, "cpu", "fp32").model)
    assert_logits_match(got, want, exact=False)
