"""Edges of prepare_hessian's damping ladder and of the group scale (reference/quantization.md §1):
the damping reported, damping 1.0 itself, an inverse that overflows fp32, and the scales of all-zero,
tiny and past-fp16-range groups."""

import pytest
import torch

from conftest import run_cli
from salactl.errors import QuantizationError
from salactl.quant.gptq import prepare_hessian
from salactl.quant.quantizer import QuantSpec, group_scale
from salactl.quant.rtn import rtn_quantize
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.loader import EMBEDDED_DIR
from test_quantize_cli import TOKENIZER_FILES, small_config

FP16_MAX = torch.finfo(torch.float16).max


def indefinite(off: float, k: int = 64) -> torch.Tensor:
    """eye(k) with H[0,1] = H[1,0] = off: eigenvalue 1 - off, mean(diag) 1, so damping d works iff d > off - 1."""
    h = torch.eye(k)
    h[0, 1] = h[1, 0] = off
    return h


@pytest.mark.parametrize("off,damp,want", [(1.035, 0.01, 0.04), (1.075, 0.01, 0.08), (1.075, 0.05, 0.08),
                                           (1.0, 0.01, 0.01)])
def test_the_damping_reported_is_the_first_of_the_0_01_ladder_that_works(off, damp, want):
    prep = prepare_hessian(indefinite(off), damp, False, "t")
    assert prep.damp == want                      # rounded: no 0.04000000000000001
    assert torch.isfinite(prep.u).all()


def test_damping_1_itself_is_tried_before_giving_up():
    """1 + 0.01·k reaches 1.0 exactly (rounded to 6 digits); off 1.995 first works there, 2.005 never."""
    assert prepare_hessian(indefinite(1.995, 2), 0.01, False, "t").damp == 1.0
    assert prepare_hessian(indefinite(1.995, 8), 0.01, True, "t").damp == 1.0
    with pytest.raises(QuantizationError, match="not positive definite even with damping 1.0"):
        prepare_hessian(indefinite(2.005, 8), 0.01, False, "t")


def test_an_inverse_past_fp32_range_raises_the_damping_until_its_factor_is_finite():
    """A one-input linear whose inputs are ~3e-20 (H = 2.006e-39): both Cholesky factorizations
    report success at 1% damping, but 1/(1.01·H) overflows fp32, so the factor is +inf; damping rises
    until (1 + d)·H passes 2^-128 (d = 0.465), never handing the solver an infinite factor. Near that
    edge the step taken depends on the LAPACK build's rounding, so only its neighbourhood is pinned."""
    h = torch.tensor([[2.006e-39]])
    prep = prepare_hessian(h, 0.01, False, "t")
    assert 0.44 <= prep.damp <= 0.5
    assert torch.isfinite(prep.u).all()


@pytest.mark.parametrize("bf16_exact", [False, True])
def test_an_all_zero_group_takes_the_scale_of_xmax_1(bf16_exact):
    spec = QuantSpec(4, 32, bf16_exact_scales=bf16_exact)
    w = torch.zeros(2, 64)
    w[1, 32:] = torch.linspace(-0.5, 0.5, 32)
    s = group_scale(w[:, :32], spec)
    # 2/15 rounded to fp16, or with bf16-exact scales to bf16 (0.1337890625, exact in fp16 too)
    two_15ths = float(torch.tensor(2 / 15).to(torch.bfloat16 if bf16_exact else torch.float16))
    assert s.tolist() == [two_15ths, two_15ths]
    assert torch.equal(s, group_scale(torch.tensor([[1.0, -0.25]] * 2), spec))
    q = rtn_quantize(w, spec)
    assert q.scales[0].float().tolist() == [two_15ths, two_15ths]
    assert bool((q.codes[:, :32] == spec.zero).all()) and bool((q.dequantized[:, :32] == 0).all())


@pytest.mark.parametrize("bf16_exact", [False, True])
@pytest.mark.parametrize("xmax", [1e-9, 2.0 ** -30, 3e-7])
def test_tiny_weights_keep_a_scale_of_at_least_the_smallest_fp16_subnormal(xmax, bf16_exact):
    """2·xmax/15 below half of fp16's smallest subnormal rounds to 0 in fp16 (and bf16-exact scales take
    the fp16 value there): the scale is clamped to 2^-24, so w/scale stays finite and the codes are real."""
    spec = QuantSpec(4, -1, bf16_exact_scales=bf16_exact)
    w = torch.tensor([[xmax, -xmax, 0.0, xmax / 3]])
    s = group_scale(w, spec)
    want = max(float(torch.tensor(2 * xmax / 15).to(torch.float16)), 2.0 ** -24)
    assert s.tolist() == [want] and want >= 2.0 ** -24
    q = rtn_quantize(w, spec)
    assert q.scales.float().tolist() == [[want]]
    codes = torch.clamp(torch.round(w / want) + 8, 0, 15)
    assert torch.equal(q.codes.float(), codes) and torch.isfinite(q.dequantized).all()


def test_a_scale_past_fp16_range_keeps_its_bf16_value_for_bf16_exact_scales():
    """xmax 6e5: 2·xmax/15 = 80000 is past fp16's 65504. An fp16-only spec gives inf; a bf16-exact one
    keeps the bf16 value (79872, finite, so the dequantized weight is too) and the fp16 scale stored is
    still inf, which _solve_group refuses (the CLI test below)."""
    w = torch.tensor([[6e5, -1.0, 3.0, 0.0]])
    assert group_scale(w, QuantSpec(4, -1)).tolist() == [float("inf")]
    spec = QuantSpec(4, -1, bf16_exact_scales=True)
    s = group_scale(w, spec)
    assert s.tolist() == [79872.0] and s.item() > FP16_MAX
    q = rtn_quantize(w, spec)
    assert torch.isfinite(q.dequantized).all() and q.dequantized[0, 0].item() == 7 * 79872.0
    assert q.scales.tolist() == [[float("inf")]]


@pytest.fixture(scope="module")
def huge_weight(tmp_path_factory):
    """A float32 checkpoint (bf16-exact scales) whose layer-0 q_proj holds one weight of 1e6."""
    cfg = small_config()
    state = random_state_dict(cfg, "cpu", torch.float32, 0)
    state["model.layers.0.self_attn.q_proj.weight"][3, 5] = 1e6
    extra = {f: EMBEDDED_DIR / f for f in TOKENIZER_FILES}
    return save_checkpoint(state, cfg.replace(torch_dtype="float32").to_hf_dict(),
                           tmp_path_factory.mktemp("src") / "huge", extra_files=extra)


@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_weights_past_fp16_scales_are_a_one_line_error(huge_weight, tmp_path, capsys, method):
    out = tmp_path / "q"
    args = ["quantize", "--model", huge_weight, "--out", out, "--method", method, "--device", "cpu"]
    if method == "gptq":
        args += ["--calib", "random", "--nsamples", 1, "--seqlen", 32, "--dtype", "float32"]
    code, _, err = run_cli(args, capsys)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 9 and len(errors) == 1, err
    assert "model.layers.0.self_attn.q_proj" in errors[0] and "too large for fp16 group scales" in errors[0]
    assert "1e+06" in errors[0]
    assert not out.exists()
