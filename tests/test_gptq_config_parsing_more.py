"""GPTQ quantization_config fields read as vLLM and SGLang read them, through `salactl run` in a
subprocess on a real RTN checkpoint of sala-nano:
- quant_method in any case (both lowercase it before dispatching on it); other values one line, exit 4;
- checkpoint_format as written (both compare it exactly): "GPTQ_V2" is refused, not guessed;
- GPTQModel `dynamic` rules applied like their get_dynamic_override: the first rule whose regex
  re.match-es (anchored at the start, not a full match) the engine's layer prefix decides, and that
  prefix is the fused self_attn.qkv_proj / mlp.gate_up_proj for q/k/v and gate/up. A "+:" rule that
  changes a quantized layer's bits/group_size/sym is refused; one that matches no layer, or repeats
  the global settings, loads, with the unmodified checkpoint's tokens and logits."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_checkpoint_variants import edit_config, logits


def cli_run(model: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "salactl", "run", "--model", str(model), "--prompt", "def f(x):",
                           "-n", "2", "--device", "cpu", "--json"], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def reference(nano_rtn_dir):
    r = cli_run(nano_rtn_dir)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["output_token_ids"], logits(nano_rtn_dir)


def variant(src: Path, dst: Path, **qc) -> Path:
    """A copy of the checkpoint with these quantization_config keys set."""
    return edit_config(Path(shutil.copytree(src, dst)), lambda d: d["quantization_config"].update(qc))


def assert_loads_like(path: Path, reference) -> None:
    r = cli_run(path)
    assert r.returncode == 0, r.stderr
    tokens, ref_logits = reference
    assert json.loads(r.stdout)["output_token_ids"] == tokens
    torch.testing.assert_close(logits(path), ref_logits, rtol=0, atol=0)


def refusal(path: Path) -> str:
    r = cli_run(path)
    assert r.returncode == 4 and r.stdout == "", r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


# -- quant_method: any case, as vLLM and SGLang lowercase it ----------------------------------------

@pytest.mark.parametrize("method", ["GPTQ", "GPTQ_Marlin"])
def test_quant_method_in_any_case_loads(nano_rtn_dir, tmp_path, reference, method):
    assert_loads_like(variant(nano_rtn_dir, tmp_path / "upper", quant_method=method), reference)


def test_uppercase_quant_method_in_a_standalone_quantize_config_loads(nano_rtn_dir, tmp_path, reference):
    moved = Path(shutil.copytree(nano_rtn_dir, tmp_path / "standalone"))
    qc = {}
    edit_config(moved, lambda d: qc.update(d.pop("quantization_config")))
    (moved / "quantize_config.json").write_text(json.dumps(qc | {"quant_method": "GPTQ"}))
    assert_loads_like(moved, reference)


@pytest.mark.parametrize("method,says", [
    ("AWQ", "quant_method 'AWQ' is not supported; salactl loads only GPTQ checkpoints (quant_method \"gptq\")"),
    (4, "quantization_config.quant_method is 4; expected a string such as \"gptq\""),
])
def test_other_quant_methods_are_refused_in_one_line(nano_rtn_dir, tmp_path, method, says):
    assert refusal(variant(nano_rtn_dir, tmp_path / "other", quant_method=method)) == f"error: {says}"


# -- checkpoint_format: compared as written, as vLLM and SGLang do ----------------------------------

def test_checkpoint_format_in_another_case_is_refused_not_guessed(nano_rtn_dir, tmp_path):
    line = refusal(variant(nano_rtn_dir, tmp_path / "fmt", checkpoint_format="GPTQ_V2", format="GPTQ_V2"))
    assert line == ("error: checkpoint_format 'GPTQ_V2' is not supported; valid: gptq, gptq_v2 (case matters: "
                    "vLLM and SGLang compare it as written)")


# -- dynamic: the engines' matching ----------------------------------------------------------------

@pytest.mark.parametrize("dynamic", [
    {"+:^model\\.visual\\..*": {"bits": 8}},                       # matches no layer of this model
    {"+:.*": {"bits": 4, "group_size": 128, "sym": True, "desc_act": False}},   # repeats the global settings
    {"+:layers\\.0\\..*": {"bits": 8}},                             # re.match is anchored: matches nothing
    {"+:.*\\.q_proj": {"bits": 8}, "+:.*\\.gate_proj": {"group_size": 32}},   # engines match qkv_proj, gate_up_proj
    {"+:.*": {}, "+:.*layers\\.0\\..*": {"bits": 8}},               # the first matching rule wins
    None,                                                           # GPTQModel writes null for none
])
def test_dynamic_rules_that_change_no_quantized_layer_load(nano_rtn_dir, tmp_path, reference, dynamic):
    assert_loads_like(variant(nano_rtn_dir, tmp_path / "dyn", dynamic=dynamic), reference)


@pytest.mark.parametrize("rule,override,module", [
    ("+:.*layers\\.0\\..*", {"bits": 8}, "model.layers.0.mlp.gate_up_proj (the fused layer vLLM and SGLang "
                                         "build from model.layers.0.mlp.gate_proj)"),
    (".*\\.qkv_proj", {"group_size": 64}, "model.layers.0.self_attn.qkv_proj (the fused layer vLLM and SGLang "
                                          "build from model.layers.0.self_attn.q_proj)"),   # no prefix is "+:"
    ("+:model\\.layers\\.1\\.self_attn", {"bits": 8}, "model.layers.1.self_attn.qkv_proj"),   # not a full match
    ("+:.*down_proj", {"sym": False}, "model.layers.0.mlp.down_proj;"),
])
def test_a_rule_that_changes_a_quantized_layer_is_refused_naming_both(nano_rtn_dir, tmp_path, rule, override,
                                                                     module):
    line = refusal(variant(nano_rtn_dir, tmp_path / "mixed", dynamic={"-:^lm_head$": {}, rule: override}))
    assert line.startswith(f"error: quantization_config.dynamic rule {rule!r} changes ")
    assert f" for {module}" in line and line.endswith("mixed-precision GPTQ checkpoints are not supported")


def test_an_invalid_rule_regex_is_refused_in_one_line(nano_rtn_dir, tmp_path):
    line = refusal(variant(nano_rtn_dir, tmp_path / "re", dynamic={"+:model\\.layers\\.(": {"bits": 4}}))
    assert line.startswith("error: quantization_config.dynamic rule '+:model\\\\.layers\\\\.(' is not a valid "
                           "regular expression (missing ), unterminated subpattern")
