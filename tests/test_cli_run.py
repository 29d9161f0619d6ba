"""`salactl run` / `salactl info` through the real console entry point."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

from salactl.runtime.checkpoint import random_state_dict

from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.presets import sala_nano
from conftest import tiny_config


def salactl(*args, **kw):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=300, **kw)


# MiniCPM3-style: a default system message when the first message is not a system one
CHAT_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                 "{{ '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}{% endif %}"
                 "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    cfg = tiny_config()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(["def fibonacci(n): return n if n < 2 else fibonacci(n-1) + fibonacci(n-2)"] * 50,
                            trainer)
    tok_file = root / "tokenizer.json"
    tok.save(str(tok_file))
    (root / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                            "add_bos_token": True, "chat_template": CHAT_TEMPLATE}))
    state = random_state_dict(cfg, "cpu", torch.bfloat16, 0)
    return save_checkpoint(state, cfg.to_hf_dict(), root / "model",
                           extra_files={"tokenizer.json": tok_file,
                                        "tokenizer_config.json": root / "tokenizer_config.json"})


def test_run_json_with_text_prompt(ckpt):
    r = salactl("run", "--model", str(ckpt), "--prompt", "def fibonacci(n):", "-n", "6", "--device", "cpu",
                "--json", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_token_ids"][0] == 1 and len(out["output_token_ids"]) == 6
    assert isinstance(out["text"], str) and out["ttft_s"] > 0 and out["decode_tok_s"] > 0
    ops = [row["op"] for row in out["roofline"]["decode"]]
    assert ops == ["qkv", "attention", "gla", "gates", "o_proj", "mlp", "lm_head", "other", "total"]
    # every row is a total over the phase's steps, and says over how many
    assert {row["steps"] for row in out["roofline"]["decode"]} == {5}
    assert {row["steps"] for row in out["roofline"]["prefill"]} == {1}
    row = out["roofline"]["prefill"][0]
    assert {"op", "bytes", "flops", "time_s", "achieved_gbps", "pct_of_peak"} <= set(row)
    assert out["peaks"]["mem_gbps"] > 0 and out["device"] == "cpu"
    assert set(out["timing"]) == {"phase_times", "op_times"}
    # which GLA prefill ran (README: `run --json`'s gla_prefill): the reference on CPU
    assert out["gla_prefill"] == "reference"
    assert out["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "max_new_tokens": 6,
                               "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0,
                               "min_p": 0.0, "ignore_eos": True, "stop": [], "stop_token_ids": []}
    assert out["finish_reason"] == "length" and out["stop_reason"] is None
    assert "fla_core" in out["env"] and out["env"]["fla_core"] == _fla_core_version()


def _fla_core_version():
    """What env.fla_core must say: fla-core's installed version, None without it (CPU, CI)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("fla-core")
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize("args,needle", [(["run", "--bogus"], "No such option: --bogus"),
                                         (["run", "-n", "abc"], "'--max-new-tokens'"),
                                         (["report", "latency"], "Missing argument"),
                                         (["nope"], "No such command")])
def test_click_usage_errors_are_one_line_with_exit_2(args, needle):
    r = salactl(*args)
    assert r.returncode == 2 and needle in r.stderr and "--help" in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="reads Linux's MemAvailable")
def test_weights_larger_than_host_memory_are_refused_before_allocating(tmp_path):
    cfg = sala_nano(vocab_size=2 ** 36)           # embeddings + lm_head alone: 2**36 x 256 x 2 x 4 B = 140 TB
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    r = salactl("run", "--model", str(tmp_path), "--random-weights", "--device", "cpu", "--prompt-ids", "1")
    assert r.returncode == 11 and "available; use dtype bf16 (--dtype bf16" in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0
    # the size stated is the float32 weights' (4 bytes a parameter), with bf16's (2 bytes) as the way out
    from salactl.units import human_bytes
    params = cfg.parameter_count()
    assert f"in float32 (its weights) needs {human_bytes(params * 4)}, but" in r.stderr, r.stderr
    assert f"(--dtype bf16, {human_bytes(params * 2)})" in r.stderr, r.stderr


@pytest.mark.parametrize("n", ["0", "1"])
def test_run_without_decode_steps_prints_a_dash(ckpt, n):
    r = salactl("run", "--model", str(ckpt), "--prompt-ids", "1,5,9", "-n", n, "--device", "cpu", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    assert "decode - tok/s" in r.stdout and "prefill roofline" in r.stdout and "decode roofline" not in r.stdout
    assert ("TTFT - ms" in r.stdout) == (n == "0")             # no token, no time to the first one


def test_run_human_output_has_roofline(ckpt):
    r = salactl("run", "--model", str(ckpt), "--prompt-ids", "1,5,9,12", "-n", "4", "--device", "cpu",
                "--temperature", "0.8", "--top-p", "0.9", "--seed", "3", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    assert "TTFT" in r.stdout and "tok/s" in r.stdout
    # the roofline is a sum over the phase's steps: the tables and floor lines say so, with the
    # decode floor per token beside it (comparable to the TPOT)
    assert "prefill roofline: totals over 1 chunk, 4 tokens" in r.stdout
    assert "decode roofline: totals over 3 steps" in r.stdout
    assert re.search(r"^prefill \(1 chunk, 4 tokens\): [\d.]+x the floor \([\d.]+ ms total\)$", r.stdout, re.M)
    assert re.search(r"^decode \(3 steps\): [\d.]+x the floor \([\d.]+ ms total, [\d.]+ ms/token\)$",
                     r.stdout, re.M)


def test_no_op_profile_says_per_op_times_are_not_measured(ckpt):
    r = salactl("run", "--model", str(ckpt), "--prompt-ids", "1,5,9", "-n", "2", "--device", "cpu",
                "--ignore-eos", "--no-op-profile")
    assert r.returncode == 0, r.stderr
    assert "times: phases from the timed generation; per op not measured (--no-op-profile)" in r.stdout


def test_version():
    import salactl as package

    r = salactl("--version")
    assert r.returncode == 0 and r.stdout == f"salactl {package.__version__}\n" and r.stderr == ""


@pytest.mark.parametrize("args,code,msg", [
    (["--model", "sala-7b", "--prompt-ids", "1"], 4, "neither a checkpoint directory nor a preset"),
    (["--model", "sala-9b", "--prompt-ids", "1"], 4, "has no embedded weights"),
    (["--prompt-ids", "1,x"], 2, "comma-separated integers"),
    (["--prompt-ids", "1", "--prompt", "a"], 2, "exactly one of"),
    pytest.param(["--prompt-ids", "1", "--device", "cuda"], 6, "no CUDA GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")),
    (["--prompt-ids", "1", "--dtype", "int3"], 2, "dtype (--dtype) 'int3' is unknown"),
    (["--prompt-ids", "1", "--top-p", "2", "-t", "1"], 2, "top_p (--top-p) must be in"),
    # options greedy decoding would ignore, whatever their value (README: ignored options are refused)
    (["--prompt-ids", "1", "--top-p", "0.9"], 2, "--top-p applies to sampling (--temperature > 0)"),
    (["--prompt-ids", "1", "--top-k", "5", "--top-p", "1"], 2, "--top-p, --top-k apply to sampling"),
    (["--prompt-ids", "1", "--seed", "7"], 2, "--seed applies to --random-weights and sampling"),
    (["--prompt-ids", "1", "--seed", "7", "-t", "0"], 2, "--seed applies to --random-weights and sampling"),
    (["--prompt-ids", "1", "--stop", ""], 2, "stop strings (--stop) must be non-empty text, got ''"),
    (["--prompt-ids", "1", "--stop-token-ids", "3,-1"], 2, "--stop-token-ids values must be >= 0, got -1"),
    (["--prompt-ids", "1", "--stop-token-ids", "3,x"], 2, "--stop-token-ids takes comma-separated integers"),
    (["--prompt-ids", "1", "--stop-token-ids", "512"], 2, "--stop-token-ids: 512 is outside the vocabulary"),
    (["--prompt-ids", "1", "--label", "x"], 2, "--label applies to the records written to --out"),
])
def test_bad_input_one_line_errors(ckpt, args, code, msg):
    if "--model" not in args:
        args = ["--model", str(ckpt), *args]
    if "--device" not in args:
        args += ["--device", "cpu"]
    r = salactl("run", *args)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("flag", ["--op-profile", "--no-op-profile"])
def test_op_profile_flags_apply_to_the_reference_engine(ckpt, flag):
    """On CPU, per-op times come from a timer around every op of the run; --no-op-profile leaves the op
    rows analytic (bytes, FLOPs, floor) and untimed, as on the GPU engine, with the phases still timed."""
    r = salactl("run", "--model", str(ckpt), "--prompt-ids", "1,5,9,12", "-n", "3", "--device", "cpu", flag, "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    for phase in ("prefill", "decode"):
        *ops, total = result["roofline"][phase]
        assert total["op"] == "total" and total["time_s"] > 0 and all(x["floor_s"] > 0 for x in ops)
        assert any(x["time_s"] for x in ops) == (flag == "--op-profile")
    assert (result["timing"]["op_times"] == "not measured (--no-op-profile)") == (flag == "--no-op-profile")


def test_missing_tokenizer_and_bad_config(ckpt, tmp_path):
    r = salactl("run", "--model", str(ckpt), "--prompt", "hi", "--tokenizer", str(tmp_path / "none"))
    assert r.returncode == 5 and "no tokenizer.json" in r.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "minicpm_sala", "hidden_size": 64}')
    r = salactl("run", "--model", str(bad), "--prompt-ids", "1")
    assert r.returncode == 3 and "lacks required keys" in r.stderr


def test_out_of_vocab_prompt(ckpt):
    r = salactl("run", "--model", str(ckpt), "--prompt-ids", "1,99999", "--device", "cpu")
    assert r.returncode == 2 and "outside the vocabulary" in r.stderr


def test_info_json():
    r = salactl("info", "--json", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["device"] == "cpu" and "H200" in out["datasheet"] and out["env"]["torch"]


def test_info_measure_caches_cpu_ceiling(tmp_path):
    env = {"SALACTL_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = salactl("info", "--measure", "--json", "--device", "cpu", env=env)
    assert r.returncode == 0, r.stderr
    peaks = json.loads(r.stdout)["peaks"]
    assert peaks["source"] in ("measured", "measured while busy") and peaks["mem_gbps"] > 0.1 and peaks["bf16_tflops"] > 0
    assert (tmp_path / "peaks.json").exists()


def test_chat_uses_the_checkpoints_template_without_an_extra_bos(ckpt):
    """As HF apply_chat_template(add_generation_prompt=True): the checkpoint's own template,
    tokenized without special tokens (no <s> unless the template writes {{ bos_token }})."""
    r = salactl("run", "--model", str(ckpt), "--prompt", "hi", "--chat", "-n", "1", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = json.loads(r.stdout)["prompt_token_ids"]
    assert ids == tok.encode(text, add_special_tokens=False).ids and ids[0] == tok.token_to_id("<|im_start|>")
    assert "ChatML" not in r.stderr


def test_streamed_text_equals_the_json_text(ckpt):
    """The stream is flushed at the end: what `run` prints is all of `text`."""
    args = ["run", "--model", str(ckpt), "--prompt", "def fib", "-n", "12", "--device", "cpu", "--ignore-eos"]
    r_json, r_human = salactl(*args, "--json"), salactl(*args)
    assert r_json.returncode == 0 and r_human.returncode == 0, r_human.stderr
    text = json.loads(r_json.stdout)["text"]
    assert r_human.stdout.startswith(text + "\n\nmodel ")


def test_run_records_render_in_latency_report(ckpt, tmp_path):
    runs = tmp_path / "runs"
    for label in ("first", "second"):
        r = salactl("run", "--model", str(ckpt), "--prompt-ids", "1,5,9", "-n", "3", "--device", "cpu",
                    "--out", str(runs), "--label", label, "--json")
        assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in (runs / "records.jsonl").read_text().splitlines()]
    assert [(x["label"], x["phase"]) for x in records] == [
        ("first", "prefill"), ("first", "decode"), ("second", "prefill"), ("second", "decode")]
    assert records[0]["kind"] == "run" and records[0]["total_input_tokens"] == 3
    dec = records[1]
    assert dec["output_throughput"] > 0 and dec["env"]["torch"]
    # SGLang's meaning: output tokens over the whole request; the decode-phase rate is decode_tok_s
    assert dec["duration"] == pytest.approx(records[0]["duration"] + 2 / dec["decode_tok_s"])
    assert dec["output_throughput"] == pytest.approx(3 / dec["duration"])
    # and says so under SGLang's name for that span, next to the decode phase's own rate
    assert dec["mean_e2e_latency_ms"] == dec["median_e2e_latency_ms"] == pytest.approx(dec["duration"] * 1e3)
    assert all("fla_core" in x["env"] and x["env"]["fla_core"] == _fla_core_version() for x in records)
    r = salactl("report", "latency", str(runs / "records.jsonl"), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "first" in md and "second" in md and "decode" in md
    r = salactl("run", "--model", str(ckpt), "--prompt-ids", "1", "--out", str(runs / "records.jsonl"))
    assert r.returncode == 2 and "is a file" in r.stderr


def test_seed_with_random_weights_is_used_by_greedy_decoding(ckpt):
    r = salactl("run", "--model", str(ckpt), "--random-weights", "--seed", "7", "--prompt-ids", "1", "-n", "1",
                "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr


def test_stop_needs_a_tokenizer_to_match_text(tmp_path):
    cfg = tiny_config()
    bare = save_checkpoint(random_state_dict(cfg, "cpu", torch.bfloat16, 0), cfg.to_hf_dict(), tmp_path / "m")
    r = salactl("run", "--model", str(bare), "--prompt-ids", "1,2", "--stop", "x", "--device", "cpu")
    assert r.returncode == 5 and "--stop matches the generated text, which needs a tokenizer" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# ---- --stop / --stop-token-ids on sala-nano, whose greedy text is real words ------------------------
NANO_RUN = ["run", "--prompt", "def f(x):", "-n", "16", "--device", "cpu", "--ignore-eos"]


@pytest.fixture(scope="module")
def nano_free_run():
    """sala-nano's greedy output for the prompt, without any stop: (output ids, tokenizer)."""
    from salactl.runtime.loader import EMBEDDED_DIR
    from salactl.runtime.tokenizer import Tokenizer

    r = salactl(*NANO_RUN, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["output_token_ids"], Tokenizer(EMBEDDED_DIR)


def test_stop_string_ends_the_text_before_it_as_vllm(nano_free_run):
    ids, tok = nano_free_run
    free = tok.decode(ids)
    cut = len(tok.decode(ids[:4]))
    stop = free[cut - 2:cut + 3]                  # across a token boundary: the stream must hold it back
    want = free[:free.find(stop)]
    ends = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))
    r = salactl(*NANO_RUN, "--stop", stop, "--stop", "never in it", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"] == want and out["finish_reason"] == "stop" and out["stop_reason"] == stop
    assert out["output_token_ids"] == ids[:ends] and out["sampling"]["stop"] == [stop, "never in it"]
    r = salactl(*NANO_RUN, "--stop", stop)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(want + "\n\nmodel ") and f"generated {ends} tok (stop)" in r.stdout


def test_stop_token_ids_end_generation_as_eos_and_hide_their_text(nano_free_run):
    ids, tok = nano_free_run
    at = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i] and tok.decode(ids[i:i + 1]).strip())
    r = salactl(*NANO_RUN, "--stop-token-ids", f"{ids[at]},0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["output_token_ids"] == ids[:at + 1] and out["text"] == tok.decode(ids[:at])
    assert out["finish_reason"] == "stop" and out["stop_reason"] == ids[at]
    assert out["sampling"]["stop_token_ids"] == [ids[at], 0]
    r = salactl(*NANO_RUN, "--stop-token-ids", str(ids[at]))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(tok.decode(ids[:at]) + "\n\nmodel ")
