"""FP8 KV scales under other tools' names: ModelOpt's and vLLM's self_attn.k_proj.k_scale /
v_proj.v_scale and the legacy single self_attn.kv_scale (k's and v's) are read as self_attn.k_scale /
v_scale, per layer or per KV head, and `salactl run` uses exactly them. Two names for one scale, a
name salactl does not read and a scale off the minicpm4 layers are one-line checkpoint errors."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import run_cli
from salactl.errors import CheckpointError
from salactl.runtime.engine import Engine
from salactl.runtime.loader import EMBEDDED_DIR, load_model

# sala-nano: minicpm4 layers 0 and 7 (2 KV heads), lightning-attn 1-6. Scales small enough that
# e4m3 (+-448) saturates keys and values: the run's tokens depend on them.
K0, V0, KV7 = torch.tensor([0.002, 0.004]), torch.tensor(0.003), torch.tensor(0.0025)
ALIASES = {"model.layers.0.self_attn.k_proj.k_scale": K0, "model.layers.0.self_attn.v_proj.v_scale": V0,
           "model.layers.7.self_attn.kv_scale": KV7}
CANONICAL = {"model.layers.0.self_attn.k_scale": K0, "model.layers.0.self_attn.v_scale": V0,
             "model.layers.7.self_attn.k_scale": KV7, "model.layers.7.self_attn.v_scale": KV7}


def nano_with(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """The embedded sala-nano checkpoint plus `tensors` in a shard of their own, listed in its index."""
    shutil.copytree(EMBEDDED_DIR, path)
    save_file({n: t.clone() for n, t in tensors.items()}, str(path / "kv-scales.safetensors"),
              metadata={"format": "pt"})
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"].update(dict.fromkeys(tensors, "kv-scales.safetensors"))
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return path


@pytest.fixture(scope="module")
def aliased(tmp_path_factory):
    return nano_with(tmp_path_factory.mktemp("kv") / "aliased", ALIASES)


def test_other_tools_names_give_the_scales_written(aliased):
    eng = Engine(load_model(aliased, "cpu", "float32").model, "cpu", kv_cache_dtype="fp8_e4m3")
    assert sorted(eng.kv_scales) == [0, 7]
    for got, want in zip(eng.kv_scales[0] + eng.kv_scales[7], (K0, V0, KV7, KV7)):
        assert torch.equal(got, want.expand(2))


def _run_tokens(model: Path, capsys) -> list[int]:
    code, out, err = run_cli(["run", "--model", model, "--prompt-ids", ",".join(map(str, range(5, 45))), "-n", 8,
                              "-t", 0, "--device", "cpu", "--kv-cache-dtype", "fp8_e4m3", "--json"], capsys)
    assert code == 0, err
    return json.loads(out)["output_token_ids"]


def test_run_uses_them_as_it_uses_our_names(aliased, tmp_path, capsys):
    ours = nano_with(tmp_path / "canonical", CANONICAL)
    other = nano_with(tmp_path / "other", {**CANONICAL, "model.layers.0.self_attn.k_scale": K0 * 100})
    got = _run_tokens(aliased, capsys)
    assert got == _run_tokens(ours, capsys)
    assert got != _run_tokens(other, capsys)          # the scales do decide the tokens


@pytest.mark.parametrize("extra,match", [
    ({"model.layers.0.self_attn.k_scale": K0}, "checkpoint has both model.layers.0.self_attn.k_proj.k_scale "
     "and model.layers.0.self_attn.k_scale for layer 0's self_attn.k_scale; keep one"),
    ({"model.layers.7.self_attn.v_scale": KV7}, "both model.layers.7.self_attn.kv_scale and "
     "model.layers.7.self_attn.v_scale"),
    ({"model.layers.0.self_attn.attn.k_scale": K0}, "KV scale model.layers.0.self_attn.attn.k_scale has a "
     "name salactl does not read; expected model.layers.N.self_attn.k_scale / v_scale"),
    ({"model.layers.1.self_attn.k_proj.k_scale": K0}, "model.layers.1.self_attn.k_proj.k_scale is not under a "
     "minicpm4 (softmax attention) layer: layer 1 is lightning-attn; the minicpm4 layers are 0, 7"),
])
def test_ambiguous_unknown_or_misplaced_scales_are_one_line_errors(tmp_path, capsys, extra, match):
    bad = nano_with(tmp_path / "bad", {**ALIASES, **extra})
    with pytest.raises(CheckpointError, match=match.replace("(", r"\(").replace(")", r"\)")):
        load_model(bad, "cpu", "float32")
    code, _, err = run_cli(["run", "--model", bad, "--prompt-ids", "1,2", "-n", 1, "--device", "cpu"], capsys)
    assert code == 4 and err.count("\n") == 1 and err.startswith("error: "), err
