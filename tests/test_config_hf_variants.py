"""config.json variants transformers (4.56+) accepts: a null eos_token_id, both `dtype` and its
deprecated alias `torch_dtype`, and rope_scaling that names the default (unscaled) RoPE. Each reads
as transformers reads it; what salactl does not implement stays a one-line config error (exit 3)."""

import json
import shutil
from pathlib import Path

import pytest

from salactl.errors import ConfigError
from salactl.runtime.config import SalaConfig
from salactl.runtime.loader import EMBEDDED_DIR, stop_token_ids
from conftest import run_cli


@pytest.fixture
def nano(tmp_path):
    return Path(shutil.copytree(EMBEDDED_DIR, tmp_path / "nano"))


def edit(path: Path, name: str, change) -> Path:
    d = json.loads((path / name).read_text())
    change(d)
    (path / name).write_text(json.dumps(d))
    return path


def run_one_token(model, capsys) -> tuple[int, str]:
    code, _, err = run_cli(["run", "--model", model, "--prompt", "hi", "-n", 1, "--device", "cpu"], capsys)
    return code, err


def test_null_eos_means_none_from_config_and_the_stops_come_from_generation_config(nano, capsys):
    edit(nano, "config.json", lambda d: d.update(eos_token_id=None))
    cfg = SalaConfig.from_file(nano / "config.json")
    assert cfg.eos_token_id == ()
    assert stop_token_ids(cfg, nano) == (2, 4)                 # generation_config.json's, as HF generate()
    assert cfg.to_hf_dict()["eos_token_id"] is None
    assert SalaConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    edit(nano, "generation_config.json", lambda d: d.pop("eos_token_id"))
    assert stop_token_ids(cfg, nano) == ()                     # not the default 2: null is no eos at all
    code, err = run_one_token(nano, capsys)
    assert code == 0, err


def test_a_missing_eos_token_id_defaults_to_2_as_in_minicpm(nano):
    """config.json without eos_token_id reads as 2 (MiniCPM's </s>), the id HF's config class defaults to."""
    edit(nano, "config.json", lambda d: d.pop("eos_token_id"))
    assert SalaConfig.from_file(nano / "config.json").eos_token_id == (2,)


def test_dtype_wins_over_its_deprecated_alias_torch_dtype():
    d = SalaConfig.from_file(EMBEDDED_DIR / "config.json").to_hf_dict()
    assert SalaConfig.from_hf_dict({**d, "torch_dtype": "float32", "dtype": "bfloat16"}).torch_dtype == "bfloat16"
    assert SalaConfig.from_hf_dict({**d, "torch_dtype": "bfloat16", "dtype": "float16"}).torch_dtype == "float16"


@pytest.mark.parametrize("torch_dtype,dtype,bad", [("bfloat16", "float64", "dtype"),
                                                   ("float64", "bfloat16", "torch_dtype")])
def test_an_unknown_dtype_in_either_key_is_a_config_error(nano, torch_dtype, dtype, bad, capsys):
    edit(nano, "config.json", lambda d: d.update(torch_dtype=torch_dtype, dtype=dtype))
    msg = f"config.{bad} 'float64' is not supported; use one of bfloat16, float16, float32"
    with pytest.raises(ConfigError, match=msg):
        SalaConfig.from_file(nano / "config.json")
    code, err = run_one_token(nano, capsys)
    assert code == 3 and err.count("\n") == 1 and msg in err, err


@pytest.mark.parametrize("key,value", [
    ("rope_scaling", {"rope_type": "default", "factor": 1.0}),
    ("rope_scaling", {"type": "default", "factor": 1.0}),
    ("rope_scaling", {"rope_type": "default", "factor": 2.0, "partial_rotary_factor": 1.0}),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0, "factor": 1.0}),
])
def test_default_rope_type_runs_unscaled_rope_whatever_else_it_holds(nano, key, value, capsys):
    edit(nano, "config.json", lambda d: d.update({key: value}))
    assert SalaConfig.from_file(nano / "config.json") == SalaConfig.from_file(EMBEDDED_DIR / "config.json")
    code, err = run_one_token(nano, capsys)
    assert code == 0, err


@pytest.mark.parametrize("value,msg", [
    ({"type": "linear", "factor": 2.0}, "config.rope_scaling asks for 'linear' RoPE scaling; salactl runs the "
                                        "lightning layers' RoPE unscaled only"),
    ({"type": "default", "rope_type": "dynamic", "factor": 2.0}, "'dynamic' RoPE scaling"),   # rope_type wins
    ({"rope_type": "default", "partial_rotary_factor": 0.5}, "has partial_rotary_factor"),
    ({"factor": 2.0}, "has factor, which salactl does not implement"),                   # no type: not default
])
def test_real_rope_scaling_stays_refused(nano, value, msg, capsys):
    edit(nano, "config.json", lambda d: d.update(rope_scaling=value))
    with pytest.raises(ConfigError, match=msg):
        SalaConfig.from_file(nano / "config.json")
    code, err = run_one_token(nano, capsys)
    assert code == 3 and err.count("\n") == 1, err


def test_quantize_calibrates_a_null_eos_checkpoint_joining_documents_with_the_generation_eos(nano, tmp_path, capsys):
    edit(nano, "config.json", lambda d: d.update(eos_token_id=None))
    out = tmp_path / "q"
    code, _, err = run_cli(["quantize", "--model", nano, "--out", out, "--method", "rtn", "--kv-cache-dtype",
                            "fp8_e4m3", "--nsamples", 2, "--seqlen", 64, "--device", "cpu", "--json"], capsys)
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["eos_token_id"] is None
