"""What `salactl quantize` writes is the source checkpoint's own data, whatever dtype it calibrates in:
unquantized tensors bit for bit, codes from the stored weights, scales every loader holds unchanged,
the files SGLang/vLLM need beside the weights; and a config naming no dtype they serve is refused."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import run_cli
from salactl.quant.api import quantize_checkpoint
from salactl.quant.sequential import QuantOptions
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from test_quantize_cli import TOKENIZER_FILES, _tensors, small_config

QUANT_SUFFIXES = (".qweight", ".qzeros", ".scales", ".g_idx")


def _checkpoint(path: Path, torch_dtype: str, extra_config: dict | None = None) -> Path:
    """small_config's random weights stored in `torch_dtype` (fp16 values use their whole mantissa)."""
    config = small_config().replace(torch_dtype=torch_dtype)
    dtype = getattr(torch, torch_dtype)
    state = {n: t.to(dtype) for n, t in random_state_dict(config, "cpu", torch.float32, 0).items()}
    extra = {f: EMBEDDED_DIR / f for f in TOKENIZER_FILES}
    return save_checkpoint(state, config.to_hf_dict() | (extra_config or {}), path, extra_files=extra)


def _unpack_rows(words: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ qweight int32 [K*bits/32, N] -> codes [K, N], unpacked from the format by hand."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    parts = [(w >> (bits * j)) & ((1 << bits) - 1) for j in range(32 // bits)]
    return torch.stack(parts, 1).reshape(-1, w.shape[1])


def _rtn_codes_by_hand(w: torch.Tensor, bits: int, group: int, bf16_exact: bool) -> torch.Tensor:
    """Symmetric RTN of w [N, K] -> codes [K, N]: scale 2·max|w|/(2^b − 1) rounded to fp16 (with
    bf16_exact, to bf16 where that value is exact in fp16 too) before w / scale is rounded."""
    maxq, zero = 2 ** bits - 1, 2 ** (bits - 1)
    codes = []
    for g0 in range(0, w.shape[1], group):
        b = w[:, g0:g0 + group].double()
        s = (2 * b.abs().amax(1) / maxq).float()
        s16 = s.half().float()
        if bf16_exact:
            sbf = s.bfloat16().float()
            s16 = torch.where(sbf.half().float() == sbf, sbf, s16)
        codes.append(torch.clamp(torch.round(w[:, g0:g0 + group] / s16[:, None]) + zero, 0, maxq))
    return torch.cat(codes, 1).t().long()


@pytest.mark.parametrize("source, dtype", [("fp16", "bf16"), ("sala-nano", "float16")])
def test_plain_tensors_and_codes_come_from_the_stored_weights_not_the_calibration_dtype(source, dtype, tmp_path,
                                                                                        capsys):
    """An fp16 source quantized in bf16 used to get bf16-rounded embeddings and codes of bf16-rounded
    weights; sala-nano (bf16) in fp16 lost its embeddings' values below fp16's range."""
    src = _checkpoint(tmp_path / "src", "float16") if source == "fp16" else EMBEDDED_DIR
    code, _, err = run_cli(["quantize", "--model", src, "--out", tmp_path / "q", "--method", "rtn",
                            "--device", "cpu", "--dtype", dtype], capsys)
    assert code == 0, err
    stored, written = _tensors(src), _tensors(tmp_path / "q")
    quantized = sorted(n[: -len(".qweight")] for n in written if n.endswith(".qweight"))
    plain = [n for n in written if not n.endswith(QUANT_SUFFIXES)]
    assert len(quantized) == 8 * small_config().num_hidden_layers * (1 if source == "fp16" else 2)
    assert sorted(plain) == sorted(set(stored) - {p + ".weight" for p in quantized})
    for n in plain:
        assert written[n].dtype == stored[n].dtype and torch.equal(written[n], stored[n]), n
    for p in quantized:
        want = _rtn_codes_by_hand(stored[p + ".weight"].float(), 4, 128, bf16_exact=source == "sala-nano")
        assert torch.equal(_unpack_rows(written[p + ".qweight"], 4), want), p


def _engine_dequantized(module) -> torch.Tensor:
    w = module.dequantized_weight()
    return w[:, torch.argsort(module.perm)] if module.perm is not None else w


@pytest.mark.parametrize("method, bits", [("rtn", 8), ("gptq", 8), ("rtn", 4)])
def test_a_bf16_checkpoints_scales_are_exact_in_bf16_so_every_loader_rebuilds_the_solvers_weights(method, bits,
                                                                                                  tmp_path):
    """vLLM/SGLang hold the scales in the served dtype (bf16 here), our CPU layouts in bf16: fp16
    scales that bf16 rounds gave them other weights than the solver's."""
    lm = load_model(_checkpoint(tmp_path / "src", "bfloat16"), "cpu", "float32")
    quantize_checkpoint(lm, tmp_path / "q", QuantOptions(bits=bits, method=method), calib="random", nsamples=2,
                        seqlen=64, device="cpu")           # lm now holds the solver's dequantized weights
    t = _tensors(tmp_path / "q")
    scales = torch.cat([t[n].flatten() for n in t if n.endswith(".scales")])
    assert torch.equal(scales.to(torch.bfloat16).to(torch.float16), scales)
    solved = dict(lm.model.named_modules())
    loaded = load_model(tmp_path / "q", "cpu", "float32").model
    for name, module in loaded.named_modules():
        if not hasattr(module, "qweight"):
            continue
        if bits == 8:
            assert module.layout == "int8"                # bf16 scales on the CPU
            assert torch.equal(_engine_dequantized(module), solved[name].weight), name
        else:                                             # the int4 kernel's product is bf16-rounded: its scales
            assert module.layout == "cpu_int4"
            assert torch.equal(module.scales_and_zeros[..., 0].float(), t[name + ".scales"].float()), name


def test_an_fp16_checkpoint_keeps_full_fp16_scales(tmp_path):
    lm = load_model(_checkpoint(tmp_path / "src", "float16"), "cpu", "float32")
    quantize_checkpoint(lm, tmp_path / "q", QuantOptions(method="rtn"), device="cpu")
    scales = _tensors(tmp_path / "q")["model.layers.0.mlp.down_proj.scales"]
    assert not torch.equal(scales.to(torch.bfloat16).to(torch.float16), scales)


def test_rtn_checkpoints_carry_no_gptq_solver_settings(tmp_path):
    from salactl.quant.writer import quantization_config

    rtn = quantization_config(QuantOptions(method="rtn"), {})
    gptq = quantization_config(QuantOptions(damp=0.05), {})
    solver_keys = {"damp_percent", "true_sequential", "damp_auto_increment"}
    assert not solver_keys & set(rtn) and gptq["damp_percent"] == 0.05 and solver_keys <= set(gptq)


def test_model_code_license_and_readme_are_copied_and_a_missing_auto_map_file_is_named(tmp_path, capsys):
    auto_map = {"AutoConfig": "configuration_sala.SalaConfig", "AutoModelForCausalLM": "modeling_sala.SalaModel",
                "AutoTokenizer": ["tokenization_sala.SalaTokenizer", None],     # not in the directory
                "AutoModel": "other-org/sala--modeling_remote.Model"}           # another Hub repository's
    src = _checkpoint(tmp_path / "src", "float32", {"auto_map": auto_map})
    files = {"configuration_sala.py": "X = 1\n", "modeling_sala.py": "from .sala_helpers import y\n",
             "sala_helpers.py": "import .sala_kernels\ny = 2\n", "sala_kernels.py": "z = 3\n",
             "LICENSE": "Apache-2.0\n", "NOTICE.txt": "notice\n", "README.md": "# model\n",
             "unrelated.py": "not named anywhere\n", "notes.md": "not copied\n"}
    for name, text in files.items():
        (src / name).write_text(text)
    code, _, err = run_cli(["quantize", "--model", src, "--out", tmp_path / "q", "--method", "rtn",
                            "--device", "cpu"], capsys)
    assert code == 0, err
    out = tmp_path / "q"
    for name in set(files) - {"unrelated.py", "notes.md"}:
        assert (out / name).read_text() == files[name], name
    assert not (out / "unrelated.py").exists() and not (out / "notes.md").exists()
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "tokenization_sala.py" in warnings[0], err
    assert json.loads((out / "config.json").read_text())["auto_map"] == auto_map


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_torch_dtype_no_server_runs_is_a_config_error(key, tmp_path, capsys):
    src = _checkpoint(tmp_path / "src", "float32")
    config = json.loads((src / "config.json").read_text())
    del config["torch_dtype"]
    config[key] = "float64"
    (src / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(["quantize", "--model", src, "--out", tmp_path / "q", "--method", "rtn"], capsys)
    assert code == 3 and err.count("\n") == 1, err
    assert f"{key} 'float64' is not supported; use one of bfloat16, float16, float32" in err
    assert not (tmp_path / "q").exists()
