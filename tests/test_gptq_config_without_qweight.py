"""A GPTQ quantization_config over a checkpoint that holds no .qweight (float weights) is refused
(exit 4), as HF and vLLM refuse it, rather than run as float under the quantized model's name;
`dynamic` "-:" rules, which leave modules unquantized, still load without any."""

import json
import subprocess
import sys

import pytest

from salactl.errors import CheckpointError
from salactl.quant.in_memory import quantized_as
from salactl.runtime.loader import load_model
from test_quantize_cli import small_config, write_random_checkpoint

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128}


@pytest.fixture
def float_ckpt(tmp_path):
    return write_random_checkpoint(tmp_path / "ckpt", small_config())


def _add_to_config(ckpt, **keys):
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(config | keys))


def test_run_refuses_float_weights_under_a_gptq_config(float_ckpt):
    _add_to_config(float_ckpt, quantization_config=GPTQ)
    r = subprocess.run([sys.executable, "-m", "salactl", "run", "--model", str(float_ckpt), "--prompt-ids", "1,2,3",
                        "-n", "2", "--json", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 4 and r.stdout == "", r.stderr
    assert r.stderr == "error: quantization_config says GPTQ but the checkpoint has no .qweight tensors; remove " \
                       "quantization_config from config.json or re-quantize\n"


@pytest.mark.parametrize("bits", [4, 8])
def test_a_standalone_quantize_config_is_named(float_ckpt, bits):
    (float_ckpt / "quantize_config.json").write_text(json.dumps({"bits": bits, "group_size": 128}))
    with pytest.raises(CheckpointError, match=r"^quantize_config.json says GPTQ but the checkpoint has no \.qweight "
                                              r"tensors; remove quantize_config.json or re-quantize$"):
        load_model(float_ckpt, "cpu", "float32")


def test_dynamic_rules_that_leave_every_module_unquantized_still_load(float_ckpt):
    _add_to_config(float_ckpt, quantization_config=GPTQ | {"dynamic": {"-:.*": {}}})
    lm = load_model(float_ckpt, "cpu", "float32")
    assert quantized_as(lm.model) is None
