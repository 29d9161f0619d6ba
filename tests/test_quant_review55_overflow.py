"""A checkpoint whose calibration activations overflow the Hessian: `salactl quantize` says so on one
line (exit 9, nothing written) and advises float32 forwards only where they ran in 16 bits; from
float32 forwards the checkpoint itself is what to check."""

import pytest
import torch

from conftest import run_cli
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.loader import EMBEDDED_DIR
from test_quantize_cli import TOKENIZER_FILES, small_config


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory):
    """layer 0's input norm scales its (unit-RMS) output to ~1e25: finite in float32 and bfloat16,
    but the Hessian's products (~1e50) are not."""
    cfg = small_config()
    state = random_state_dict(cfg, "cpu", torch.float32, 0)
    state["model.layers.0.input_layernorm.weight"].fill_(1e25)
    extra = {f: EMBEDDED_DIR / f for f in TOKENIZER_FILES}
    return save_checkpoint(state, cfg.replace(torch_dtype="float32").to_hf_dict(),
                           tmp_path_factory.mktemp("src") / "hot", extra_files=extra)


@pytest.mark.parametrize("method", ["gptq", "rtn"])
@pytest.mark.parametrize("dtype,advises_float32", [("float32", False), ("bfloat16", True)])
def test_the_overflow_advice_fits_the_dtype_the_forwards_ran_in(overflowing, tmp_path, capsys, method, dtype,
                                                               advises_float32):
    out = tmp_path / "q"
    code, _, err = run_cli(["quantize", "--model", overflowing, "--out", out, "--method", method, "--calib",
                            "random", "--nsamples", 1, "--seqlen", 32, "--device", "cpu", "--dtype", dtype], capsys)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 9 and len(errors) == 1, err
    line = errors[0]
    assert "the Hessian of model.layers.0.self_attn.q_proj" in line and "NaN/Inf" in line
    assert ("--dtype float32" in line) == advises_float32, line
    assert advises_float32 or "check the checkpoint" in line
    assert not out.exists()
