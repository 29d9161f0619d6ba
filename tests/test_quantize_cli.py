"""`salactl quantize` end to end on a tiny random checkpoint: the written GPTQ files, loading them back,
FP8 KV scales, and every bad input (one line, its own exit code, nothing written)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import rel_err, run_cli
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from salactl.runtime.config import LIGHTNING, SPARSE
from salactl.runtime.ops.w4a16 import reference
from salactl.runtime.presets import sala_nano

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def small_config():
    """sala-nano's structure (and tokenizer vocabulary) at half width and 4 layers: sparse 0 and 3."""
    return sala_nano().replace(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                               mixer_types=(SPARSE, LIGHTNING, LIGHTNING, SPARSE), num_attention_heads=4,
                               num_key_value_heads=2, lightning_nh=4, lightning_nkv=4, dim_model_base=32)


def write_random_checkpoint(path: Path, config, seed=0, poison: str | None = None) -> Path:
    """`poison`: a tensor that gets NaNs."""
    state = random_state_dict(config, "cpu", torch.float32, seed)
    if poison:
        state[poison].view(-1)[:4] = float("nan")
    extra = {f: EMBEDDED_DIR / f for f in TOKENIZER_FILES if (EMBEDDED_DIR / f).exists()}
    return save_checkpoint(state, config.replace(torch_dtype="float32").to_hf_dict(), path, extra_files=extra)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_checkpoint(tmp_path_factory.mktemp("src") / "nano", small_config())


@pytest.fixture(scope="module")
def calib_jsonl(tmp_path_factory):
    p = tmp_path_factory.mktemp("calib") / "calib.jsonl"
    src = (Path(__file__).resolve().parent.parent / "quant" / "gptq.py").read_text()
    p.write_text("\n".join(json.dumps({"text": src[i:i + 1500]}) for i in range(0, len(src), 1500)) + "\n")
    return p


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(f, framework="pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


def test_quantize_writes_a_marlin_compatible_gptq_checkpoint(ckpt, calib_jsonl, tmp_path, capsys):
    out = tmp_path / "q"
    code, stdout, err = run_cli(["quantize", "--model", ckpt, "--out", out, "--calib", calib_jsonl,
                                 "--nsamples", 4, "--seqlen", 96, "--device", "cpu", "--dtype", "float32",
                                 "--kv-cache-dtype", "fp8_e4m3", "--json"], capsys)
    assert code == 0, err
    record = json.loads(stdout)
    assert record["calibration"]["samples"] == 4 and record["calibration"]["seqlen"] == 96
    assert record["fraction_better_than_rtn"] >= 0.95
    assert record["peak_gpu_gib"] is None            # quantized on the CPU
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert {k: qc[k] for k in ("quant_method", "bits", "group_size", "desc_act", "sym", "checkpoint_format",
                               "format", "lm_head")} == {
        "quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
        "checkpoint_format": "gptq", "format": "gptq", "lm_head": False}
    assert qc["meta"]["quantizer"][0].startswith("salactl:")
    # lm_head stays full precision (qc["lm_head"] False) and the meta lists it with the embeddings
    assert qc["meta"]["unquantized_modules"][:2] == ["model.embed_tokens", "lm_head"]
    for f in TOKENIZER_FILES:
        assert (out / f).read_bytes() == (ckpt / f).read_bytes()
    t = _tensors(out)
    quantized = sorted(n[: -len(".qweight")] for n in t if n.endswith(".qweight"))
    assert len(quantized) == 4 * 8 and "lm_head" not in quantized
    for p in quantized:
        k = t[p + ".g_idx"].shape[0]
        assert t[p + ".qweight"].dtype == torch.int32 and t[p + ".qweight"].shape[0] == k // 8
        assert bool((t[p + ".qzeros"] == 0x77777777).all())
        assert torch.equal(t[p + ".g_idx"], torch.arange(k, dtype=torch.int32) // 128)
        assert t[p + ".scales"].dtype == torch.float16 and p + ".weight" not in t
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
        assert t[name].dtype == torch.float32                  # the source's dtype
    assert set(n for n in t if n.endswith(("k_scale", "v_scale"))) == {
        f"model.layers.{i}.self_attn.{s}" for i in (0, 3) for s in ("k_scale", "v_scale")}
    sg = json.loads((out / "kv_cache_scales.json").read_text())
    assert sg["model_type"] == "minicpm_sala" and sg["kv_cache"]["dtype"] == "float8_e4m3fn"
    assert set(sg["kv_cache"]["scaling_factor"]["0"]) == {"0", "1", "2", "3"}      # every layer (SGLang's schema)
    assert sg["kv_cache"]["scaling_factor"]["0"]["1"] == sg["kv_cache"]["scaling_factor"]["0"]["2"] == 1.0
    assert not list(tmp_path.glob(".q.tmp-*"))


def test_loaded_checkpoint_matches_the_dequantized_reference(ckpt, tmp_path):
    from salactl.quant.sequential import QuantOptions, quantize_model
    from salactl.quant.writer import quantization_config, write_quantized_checkpoint
    from salactl.runtime.engine import Engine

    config = small_config()
    ref = load_model(str(ckpt), "cpu", "float32").model
    calib = torch.randint(0, config.vocab_size, (3, 80), generator=torch.Generator().manual_seed(1))
    opts = QuantOptions(group_size=64, desc_act=True)
    res = quantize_model(ref, config, calib, opts)          # ref now holds the dequantized weights
    qc = quantization_config(opts, res.skipped)
    write_quantized_checkpoint(tmp_path / "q", config, ref, res.quantized, qc, ckpt)
    prompt = torch.randint(0, config.vocab_size, (300,), generator=torch.Generator().manual_seed(2)).tolist()
    want = Engine(ref, "cpu", chunk_size=128).prefill(Engine(ref, "cpu").new_sequence(), prompt, all_logits=True)

    weights = dict(ref.named_modules())
    for dtype in ("float32", "bfloat16"):
        lm = load_model(str(tmp_path / "q"), "cpu", dtype)          # torch's int4 CPU kernel, bf16 activations
        quantized = {n: m for n, m in lm.model.named_modules() if hasattr(m, "layout")}
        assert {m.layout for m in quantized.values()} == {"cpu_int4"} and set(quantized) == set(res.quantized)
        for n, m in quantized.items():          # the loader's unpacking and act-order repacking: bf16 scales only
            w = m.dequantized_weight()
            w = w[:, torch.argsort(m.perm)] if m.perm is not None else w
            assert rel_err(w, weights[n].weight.float()) < 4e-3, n
        eng = Engine(lm.model, "cpu", chunk_size=128)
        got = eng.prefill(eng.new_sequence(), prompt, all_logits=True)
        assert rel_err(got, want) < 5e-2, dtype           # fp32 at 1.4e-2: the linears' bf16 activations


def _rewrite(src: Path, dst: Path, change) -> Path:
    shutil.copytree(src, dst)
    t = _tensors(dst)
    cfg = json.loads((dst / "config.json").read_text())
    change(t, cfg)
    for f in dst.glob("*.safetensors"):
        f.unlink()
    (dst / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def quantized(ckpt, tmp_path_factory):
    from salactl.quant.sequential import QuantOptions, quantize_model
    from salactl.quant.writer import quantization_config, write_quantized_checkpoint

    config = small_config()
    model = load_model(str(ckpt), "cpu", "float32").model
    opts = QuantOptions(method="rtn")
    res = quantize_model(model, config, None, opts)
    qc = quantization_config(opts, res.skipped)
    return write_quantized_checkpoint(tmp_path_factory.mktemp("q") / "rtn", config, model, res.quantized, qc, ckpt)


def test_gptq_v2_checkpoint_of_another_tool_loads_identically(quantized, tmp_path):
    def to_v2(t, cfg):
        for n in [n for n in t if n.endswith(".qzeros")]:
            t[n] = t[n] + 0x11111111                       # v1 (z-1) -> v2 (z), as GPTQModel converts
        del t["model.layers.1.mlp.up_proj.g_idx"]          # g_idx is optional (k // group)
        cfg["quantization_config"].update(checkpoint_format="gptq_v2", format="gptq_v2")
        cfg["quantization_config"].pop("meta")

    v2 = _rewrite(quantized, tmp_path / "v2", to_v2)
    ids = torch.tensor([5, 9, 100, 7])
    a = load_model(str(quantized), "cpu", "float32").model
    b = load_model(str(v2), "cpu", "float32").model
    for m in (a, b):
        assert type(m.model.layers[1].mlp.up_proj).__name__ == "GPTQLinear"
    wa = a.model.layers[1].mlp.up_proj.dequantized_weight()
    assert torch.equal(wa, b.model.layers[1].mlp.up_proj.dequantized_weight())
    ha = a.model.embed_tokens(ids)
    assert torch.equal(a.model.layers[2].mlp(ha, lambda n: __import__("contextlib").nullcontext()),
                       b.model.layers[2].mlp(ha, lambda n: __import__("contextlib").nullcontext()))


@pytest.mark.parametrize("change,match", [
    (lambda t, c: t.__setitem__("model.layers.0.mlp.down_proj.qweight",
                                t["model.layers.0.mlp.down_proj.qweight"][:-1]), "shape"),
    (lambda t, c: t.__setitem__("model.layers.0.mlp.down_proj.qzeros",
                                torch.zeros_like(t["model.layers.0.mlp.down_proj.qzeros"])), "asymmetric"),
    (lambda t, c: t.pop("model.layers.0.mlp.down_proj.scales"), "lacks tensor"),
    (lambda t, c: t.__setitem__("model.layers.0.mlp.down_proj.weight", torch.zeros(128, 256)), "unexpected"),
    (lambda t, c: c["quantization_config"].update(sym=False), "asymmetric"),
    (lambda t, c: c["quantization_config"].update(bits=3), "bits"),
    (lambda t, c: c["quantization_config"].update(checkpoint_format="marlin"), "checkpoint_format"),
])
def test_bad_gptq_checkpoints_are_one_line_errors(quantized, tmp_path, change, match, capsys):
    bad = _rewrite(quantized, tmp_path / "bad", change)
    code, _, err = run_cli(["run", "--model", bad, "--prompt-ids", "1,2", "-n", 1, "--device", "cpu"], capsys)
    assert code == 4, err
    assert match in err and len(err.strip().splitlines()) == 1


def test_rtn_and_act_order_options(ckpt, tmp_path, capsys):
    code, stdout, err = run_cli(["quantize", "--model", ckpt, "--out", tmp_path / "a", "--calib", "random",
                                 "--nsamples", 2, "--seqlen", 64, "--device", "cpu", "--dtype", "float32",
                                 "--desc-act", "--group-size", 32, "--bits", 8, "--json"], capsys)
    assert code == 0, err
    qc = json.loads((tmp_path / "a" / "config.json").read_text())["quantization_config"]
    assert qc["desc_act"] is False and qc["static_groups"] is True and qc["bits"] == 8
    assert json.loads(stdout)["clip_search"] is True and qc["meta"]["clip_search"] is True
    t = _tensors(tmp_path / "a")
    assert torch.equal(t["model.layers.3.mlp.down_proj.g_idx"], torch.arange(256, dtype=torch.int32) // 32)
    assert bool((t["model.layers.3.mlp.down_proj.qzeros"] == 0x7F7F7F7F).all())
    lm = load_model(str(tmp_path / "a"), "cpu", "float32")
    down = lm.model.model.layers[3].mlp.down_proj
    assert down.bits == 8 and down.layout == "int8"
    want = reference.dequantize(t["model.layers.3.mlp.down_proj.qweight"], t["model.layers.3.mlp.down_proj.scales"],
                                t["model.layers.3.mlp.down_proj.g_idx"], 8)
    assert rel_err(down.dequantized_weight(), want) < 4e-3           # bf16 scales
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(0))
    assert rel_err(down(x), x @ want.t()) < 1e-2                     # bf16 activations
    code, stdout, err = run_cli(["quantize", "--model", ckpt, "--out", tmp_path / "r", "--method", "rtn",
                                 "--calib", "random", "--nsamples", 2, "--seqlen", 64, "--device", "cpu"], capsys)
    assert code == 0 and "RTN 4-bit g128" in stdout and "error below RTN" not in stdout   # no self-comparison
    assert "err, RTN err: relative layer-output error" in stdout and "of safetensors, from " in stdout
    code, stdout, err = run_cli(["quantize", "--model", ckpt, "--out", tmp_path / "n", "--method", "rtn",
                                 "--device", "cpu", "--json"], capsys)
    rec = json.loads(stdout)
    assert code == 0 and rec["calibration"] is None and "RTN needs no calibration data" in err
    assert rec["damp"] is None and rec["desc_act"] is False and rec["clip_search"] is False   # RTN uses none
    sizes = {name: sum(f.stat().st_size for f in Path(d).glob("*.safetensors"))
             for name, d in (("source", ckpt), ("written", tmp_path / "n"))}
    assert rec["checkpoint_bytes"] == sizes and sizes["written"] < sizes["source"]
    progress = [line for line in err.splitlines() if line.startswith("quantizing: ")]   # stderr is no terminal
    assert 1 <= len(progress) <= 10 and " module groups (" in progress[-1]
    assert progress[-1].split()[1].split("/")[0] == progress[-1].split()[1].split("/")[1]
    # no calibration forwards: their time is µs of bookkeeping, which one preemption on a loaded CI machine
    # can stretch past 10 ms (the default 128 x 2048 calibration tokens through sala-nano take far longer)
    assert rec["seconds"]["forward"] < 1.0 and all(m["error"] is None for m in rec["modules"])
    assert torch.equal(_tensors(tmp_path / "n")["model.layers.3.mlp.down_proj.qweight"],
                       _tensors(tmp_path / "r")["model.layers.3.mlp.down_proj.qweight"])


def test_unquantized_tensors_keep_the_source_dtype_whatever_quantize_computes_in(tmp_path, capsys):
    """sala-nano is stored in bfloat16; quantizing it in float32 on the CPU must not write float32
    embeddings and lm_head (twice the bytes SGLang/vLLM would load)."""
    code, _, err = run_cli(["quantize", "--out", tmp_path / "q", "--method", "rtn", "--device", "cpu",
                            "--dtype", "float32"], capsys)
    assert code == 0, err
    t = _tensors(tmp_path / "q")
    assert {t[n].dtype for n in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight")} == {
        torch.bfloat16}
    assert json.loads((tmp_path / "q" / "config.json").read_text())["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("args, named", [
    (["--tokenizer", EMBEDDED_DIR], "--tokenizer applies"),
    (["--nsamples", 128, "--seqlen", 2048], "--nsamples, --seqlen apply"),       # their defaults
    (["--batch-tokens", 4096], "--batch-tokens applies"),
])
def test_rtn_without_calibration_refuses_the_calibration_options(args, named, ckpt, tmp_path, capsys):
    code, _, err = run_cli(["quantize", "--model", ckpt, "--out", tmp_path / "q", "--method", "rtn", "--device", "cpu",
                            *args], capsys)
    assert code == 2 and err.strip().count("\n") == 0, err
    assert f"error: {named} to calibration data, which --method rtn reads only with --calib or an fp8 " \
           "--kv-cache-dtype; drop" in err
    assert not (tmp_path / "q").exists()


def test_rtn_takes_the_calibration_options_for_fp8_kv_scales(ckpt, tmp_path, capsys):
    code, out, err = run_cli(["quantize", "--model", ckpt, "--out", tmp_path / "q", "--method", "rtn", "--device", "cpu",
                              "--kv-cache-dtype", "fp8_e5m2", "--tokenizer", ckpt, "--nsamples", 2, "--seqlen", 32,
                              "--batch-tokens", 32, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["calibration"]["samples"] == 2


def test_quantize_checkpoint_refuses_a_tokenizer_rtn_would_not_use(ckpt, tmp_path):
    from salactl.errors import UsageError
    from salactl.quant.api import quantize_checkpoint
    from salactl.quant.sequential import QuantOptions

    with pytest.raises(UsageError, match="^tokenizer \\(--tokenizer\\) is unused: RTN without calib"):
        quantize_checkpoint(ckpt, tmp_path / "q", QuantOptions(method="rtn"), tokenizer=ckpt, device="cpu")
    assert not (tmp_path / "q").exists()


def _nothing_quantizable(tmp: Path) -> Path:
    cfg = sala_nano().replace(hidden_size=64, intermediate_size=192, num_attention_heads=2, num_key_value_heads=1,
                              lightning_nh=2, lightning_nkv=2, dim_model_base=16)
    return write_random_checkpoint(tmp / "small", cfg)


@pytest.mark.parametrize("case", ["bits", "group", "method", "damp", "exists", "empty_calib", "no_text_field",
                                  "nan", "nan_weight_rtn", "nan_last_weight", "shapes", "kv_dtype", "rtn_desc_act",
                                  "rtn_damp", "rtn_clip_search", "per_head_without_fp8", "tokenizer_with_random_ids"])
def test_bad_quantize_inputs_are_one_line_errors_and_write_nothing(case, ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["quantize", "--model", ckpt, "--out", out, "--calib", "random", "--nsamples", 2, "--seqlen", 32,
            "--device", "cpu", "--dtype", "float32"]
    expected = {"bits": 2, "group": 2, "method": 2, "damp": 2, "exists": 10, "empty_calib": 7, "no_text_field": 7,
                "nan": 9, "nan_weight_rtn": 9, "nan_last_weight": 9, "shapes": 9, "kv_dtype": 2, "rtn_desc_act": 2,
                "rtn_damp": 2, "rtn_clip_search": 2, "per_head_without_fp8": 2, "tokenizer_with_random_ids": 2}[case]
    if case == "bits":
        args += ["--bits", 3]
    elif case == "group":
        args += ["--group-size", 48]
    elif case == "method":
        args += ["--method", "awq"]
    elif case == "damp":
        args += ["--damp", 0]
    elif case == "exists":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case in ("empty_calib", "no_text_field"):
        f = tmp_path / "c.jsonl"
        f.write_text("" if case == "empty_calib" else '{"content": "x"}\n')
        args[args.index("random")] = f
    elif case == "nan":
        args[2] = write_random_checkpoint(tmp_path / "nan", small_config(), poison="model.layers.0.input_layernorm.weight")
    elif case == "nan_weight_rtn":        # no calibration forward to trip over it
        args[2] = write_random_checkpoint(tmp_path / "nan", small_config(), poison="model.layers.0.self_attn.q_proj.weight")
        args += ["--method", "rtn"]
    elif case == "nan_last_weight":       # GPTQ: no later Hessian to trip over it
        cfg = small_config()
        last = f"model.layers.{cfg.num_hidden_layers - 1}.mlp.down_proj.weight"
        args[2] = write_random_checkpoint(tmp_path / "nan", cfg, poison=last)
    elif case == "shapes":
        args[2] = _nothing_quantizable(tmp_path)
    elif case == "kv_dtype":
        args += ["--kv-cache-dtype", "fp4"]
    elif case in ("rtn_desc_act", "rtn_damp", "rtn_clip_search"):      # options RTN would ignore
        args += ["--method", "rtn", *{"rtn_desc_act": ["--desc-act"], "rtn_damp": ["--damp", 0.05],
                                      "rtn_clip_search": ["--no-clip-search"]}[case]]
    elif case == "per_head_without_fp8":
        args += ["--kv-scales-per-head"]
    elif case == "tokenizer_with_random_ids":
        args += ["--tokenizer", tmp_path / "missing"]
    code, stdout, err = run_cli(args, capsys)
    assert code == expected, err
    lines = [line for line in err.strip().splitlines() if not line.startswith("quantizing: ")]  # progress
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    if case == "exists":
        assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    else:
        assert not out.exists()
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_profile_of_a_gptq_checkpoint_needs_its_own_weights_flag(quantized, tmp_path, capsys):
    code, _, err = run_cli(["profile", "--torch", "--model", quantized, "--device", "cpu", "--context", 16,
                            "--weights", "w8a16", "--out", tmp_path / "p"], capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 3 and len(errors) == 1 and "pass --weights w4a16" in errors[0], err
    assert not (tmp_path / "p").exists()
    code, out, err = run_cli(["profile", "--torch", "--model", quantized, "--device", "cpu", "--context", 16,
                              "--weights", "w4a16", "--out", tmp_path / "p", "--json"], capsys)
    assert code == 0, err
