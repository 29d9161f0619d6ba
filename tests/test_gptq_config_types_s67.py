"""GPTQ quantization_config values are read with their JSON types, not Python's truthiness or
int/bool equality (bool is an int, 4.0 == 4): vLLM and transformers use `desc_act` and `sym` as
written, so `"desc_act": "false"` is true to them, and a checkpoint whose author meant false is
another model there. Such values are refused in one line (exit 4) naming the key, the value as JSON
and what is expected; the same goes for `dynamic` overrides. A group_size that does not divide a
module's in_features names the module, in_features % group_size and the fix."""

import json
import shutil
from pathlib import Path

import pytest

from salactl.errors import CheckpointError
from salactl.quant.loading import parse_quant_config
from test_gptq_config_parsing_more import refusal, variant

QC = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


@pytest.mark.parametrize("key,value,says", [
    ("desc_act", "false", 'quantization_config.desc_act = "false"; expected true or false (a JSON string; '
                          "write it without quotes)"),
    ("desc_act", 0, "quantization_config.desc_act = 0; expected true or false"),
    ("sym", None, "quantization_config.sym = null; expected true or false"),
    ("sym", 1, "quantization_config.sym = 1; expected true or false"),
    ("sym", "true", 'quantization_config.sym = "true"; expected true or false (a JSON string; write it without '
                    "quotes)"),
    ("bits", "4", 'quantization_config.bits = "4"; expected the integer 4 or 8 (a JSON string; write it without '
                  "quotes)"),
    ("bits", 4.0, "quantization_config.bits = 4.0; expected the integer 4 or 8"),
    ("bits", True, "quantization_config.bits = true; expected the integer 4 or 8"),
    ("bits", 3, "quantization_config.bits = 3; salactl loads only 4- and 8-bit GPTQ"),
    ("group_size", 128.0, "quantization_config.group_size = 128.0; expected an integer: a positive group size "
                          "such as 128, or -1 for one group per row"),
    ("group_size", True, "quantization_config.group_size = true; expected an integer"),
    ("group_size", 0, "quantization_config.group_size = 0; expected an integer: a positive group size"),
])
def test_mistyped_values_are_refused_naming_key_value_and_type(key, value, says):
    with pytest.raises(CheckpointError) as e:
        parse_quant_config({**QC, key: value})
    assert str(e.value).startswith(says), str(e.value)


def test_null_desc_act_is_false_as_vllm_reads_it():
    assert parse_quant_config({**QC, "desc_act": None})["desc_act"] is False


def test_missing_bits_is_named():
    with pytest.raises(CheckpointError, match="quantization_config has no bits; expected the integer 4 or 8"):
        parse_quant_config({k: v for k, v in QC.items() if k != "bits"})


def test_json_booleans_and_integers_still_parse():
    assert parse_quant_config(QC) == {"bits": 4, "group_size": 128, "fmt": "gptq", "desc_act": False}
    assert parse_quant_config({**QC, "desc_act": True, "group_size": -1, "bits": 8})["desc_act"] is True
    # absent keys keep their defaults (AutoGPTQ's oldest quantize_config.json lacks some)
    minimal = parse_quant_config({"quant_method": "gptq", "bits": 4})
    assert minimal["group_size"] == -1 and minimal["desc_act"] is False


@pytest.mark.parametrize("override,says", [
    ({"sym": 1}, "sets sym = 1; expected true or false"),
    ({"bits": 4.0}, "sets bits = 4.0; expected the integer 4 or 8"),
    ({"group_size": "128"}, 'sets group_size = "128"; expected an integer'),
    ({"desc_act": "false"}, 'sets desc_act = "false"; expected true or false'),
])
def test_mistyped_dynamic_overrides_are_refused(override, says):
    with pytest.raises(CheckpointError) as e:
        parse_quant_config({**QC, "dynamic": {"+:.*q_proj.*": override}})
    assert str(e.value).startswith("quantization_config.dynamic rule '+:.*q_proj.*' " + says), str(e.value)


@pytest.mark.parametrize("dynamic", [False, 0, "", []])
def test_a_falsy_dynamic_that_is_no_object_is_refused(dynamic):
    with pytest.raises(CheckpointError, match="quantization_config.dynamic is a .*; expected an object"):
        parse_quant_config({**QC, "dynamic": dynamic})


def test_null_dynamic_is_no_rules():      # GPTQModel writes "dynamic": null
    assert parse_quant_config({**QC, "dynamic": None})["bits"] == 4


# -- through `salactl run` on a real RTN checkpoint ------------------------------------------------

def test_string_desc_act_is_exit_4_in_one_line(nano_rtn_dir, tmp_path):
    line = refusal(variant(nano_rtn_dir, tmp_path / "str", desc_act="false"))
    assert line.startswith('error: quantization_config.desc_act = "false"; expected true or false'), line


def test_integer_sym_is_not_called_asymmetric(nano_rtn_dir, tmp_path):
    line = refusal(variant(nano_rtn_dir, tmp_path / "int", sym=1))
    assert line.startswith("error: quantization_config.sym = 1; expected true or false"), line
    assert "asymmetric" not in line


def test_standalone_quantize_config_json_is_read_with_the_same_types(nano_rtn_dir, tmp_path):
    moved = Path(shutil.copytree(nano_rtn_dir, tmp_path / "standalone"))
    cfg = json.loads((moved / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    (moved / "config.json").write_text(json.dumps(cfg))
    (moved / "quantize_config.json").write_text(json.dumps(qc | {"bits": "4"}))
    assert refusal(moved).startswith('error: quantization_config.bits = "4"; expected the integer 4 or 8')


def test_group_size_not_dividing_in_features_names_module_and_remainder(nano_rtn_dir, tmp_path):
    # sala-nano's first quantized linear with in_features 256: 256 % 96 = 64
    line = refusal(variant(nano_rtn_dir, tmp_path / "g96", group_size=96))
    assert "in_features 256 is not a multiple of quantization_config.group_size 96 (256 % 96 = 64)" in line, line
    assert line.startswith("error: model.layers.") and "cannot pack" not in line
