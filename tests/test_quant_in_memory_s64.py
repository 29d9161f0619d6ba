"""--weights w4a16 / w8a16 (quant/in_memory.py) on a bf16 model reads exactly what `salactl quantize
--method rtn` writes for it: the same codes and the same scales, which for a checkpoint served in bf16
are exact in bf16 too (quantizer.py), so the CPU layouts' bf16 scales round nothing away."""

import pytest
import torch

from salactl.quant.api import quantize_checkpoint
from salactl.quant.in_memory import quantize_rtn_in_memory
from salactl.quant.sequential import QuantOptions
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.loader import load_model
from test_quantize_cli import small_config


@pytest.mark.parametrize("bits", [4, 8])
def test_in_memory_rtn_equals_the_rtn_checkpoint_of_a_bf16_model(tmp_path, bits):
    config = small_config().replace(torch_dtype="bfloat16")
    src = save_checkpoint(random_state_dict(config, "cpu", torch.bfloat16, 0), config.to_hf_dict(), tmp_path / "src")
    quantize_checkpoint(src, tmp_path / "q", QuantOptions(bits=bits, method="rtn"), device="cpu")
    from_file = load_model(tmp_path / "q", "cpu", "bfloat16").model
    lm = load_model(src, "cpu", "bfloat16")
    in_memory = quantize_rtn_in_memory(lm.model, lm.config, bits=bits)
    file_buffers = dict(from_file.named_buffers())
    compared = 0
    for name, t in in_memory.named_buffers():
        if name.endswith(("qweight", "scales", "scales_and_zeros")):
            assert torch.equal(t, file_buffers[name]), name
            compared += 1
    assert compared >= 2 * 8 * config.num_hidden_layers
