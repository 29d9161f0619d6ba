"""Input checks shared by several commands: --seed's range, and a tokenizer with more ids than the
model's vocabulary (one exit code, 5, wherever it is caught)."""

import json

import pytest
import torch

from conftest import run_cli, tiny_config
from salactl.errors import UsageError
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.ops.selection.reference import compress_keys, num_windows, select_blocks
from salactl.runtime.sampling import SamplingParams


@pytest.mark.parametrize("seed", ["-1", str(2**63), "99999999999999999999999"])
@pytest.mark.parametrize("command", [["run", "--prompt", "hi", "--max-new-tokens", "1"],
                                     ["eval", "passkey", "--lengths", "64", "--trials", "1"],
                                     ["bench", "--profile", "soar", "--scale", "0.001"]])
def test_seed_out_of_range_is_a_one_line_usage_error(command, seed, capsys):
    code, out, err = run_cli([*command, "--seed", seed], capsys)
    assert code == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1 and "--seed" in err and "Traceback" not in err


def test_sampling_params_refuse_a_seed_torch_cannot_take():
    with pytest.raises(UsageError, match="--seed"):
        SamplingParams(temperature=1.0, seed=2**64)
    assert SamplingParams(temperature=1.0, seed=2**63 - 1).seed == 2**63 - 1


@pytest.fixture(scope="module")
def small_vocab_checkpoint(tmp_path_factory):
    """sala-nano's shapes with 512 token ids, beside sala-nano's 4096-id tokenizer."""
    cfg = tiny_config()
    out = tmp_path_factory.mktemp("small-vocab") / "ckpt"
    return save_checkpoint(random_state_dict(cfg, "cpu", torch.float32, 0), cfg.to_hf_dict(), out,
                           extra_files={"tokenizer.json": EMBEDDED_DIR / "tokenizer.json"})


@pytest.mark.parametrize("command", [["run", "--prompt", "hi", "--max-new-tokens", "1"],
                                     ["eval", "ppl", "--max-tokens", "64"],
                                     ["bench", "--profile", "soar", "--dataset", "speed.jsonl"],
                                     ["sweep", "--topk", "2", "--requests", "1", "--kl-len", "64"]])
def test_tokenizer_larger_than_the_model_exits_5_everywhere(command, small_vocab_checkpoint, tmp_path, capsys):
    rows = [{"question": f"the quick brown fox {i}", "model_response": "jumps over the dog"} for i in range(3)]
    (tmp_path / "speed.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    command = [str(tmp_path / a) if a == "speed.jsonl" else a for a in command]
    args = [*command, "--model", str(small_vocab_checkpoint), "--device", "cpu"]
    if command[0] == "sweep":
        args += ["--tokenizer", str(EMBEDDED_DIR / "tokenizer.json"), "--out", str(tmp_path / "sw")]
    code, out, err = run_cli(args, capsys)
    assert code == 5, err
    assert "tokenizer has 4096 tokens but the model only 512" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sw").exists()


def test_topk_at_most_init_blocks_is_warned_because_queries_lose_their_own_block(tmp_path, capsys):
    cfg = tiny_config(topk=1, init_blocks=1)
    sc = cfg.sparse_config
    assert tiny_config().sparse_config.forced_blocks_note is None
    assert "topk 1 <= init_blocks 1" in sc.forced_blocks_note
    t, nblocks = 12 * sc.block_size + 3, 13                       # the query's own block is 12
    q, k = torch.randn(1, 4, 8, dtype=torch.float64), torch.randn(t + 1, 2, 8, dtype=torch.float64)
    k1 = compress_keys(k, sc, 0, num_windows(t + 1, sc))
    kept = select_blocks(q, k1, torch.tensor([t]), sc, nblocks)[0, 0].nonzero().flatten().tolist()
    assert 0 in kept and 12 not in kept and len(kept) == sc.selected_blocks
    ckpt = save_checkpoint(random_state_dict(cfg, "cpu", torch.float32, 0), cfg.to_hf_dict(), tmp_path / "ckpt")
    ids = ",".join(str(3 + i % 500) for i in range(sc.dense_len + 40))
    code, out, err = run_cli(["run", "--model", ckpt, "--prompt-ids", ids, "--max-new-tokens", "1", "--json"], capsys)
    assert code == 0, err
    assert err.count("init_blocks 1") == 1 and "drop their own block" in err
    short = ",".join(["3"] * 8)
    code, out, err = run_cli(["run", "--model", ckpt, "--prompt-ids", short, "--max-new-tokens", "1", "--json"], capsys)
    assert code == 0 and "init_blocks" not in err     # never reaches the sparse path


@pytest.mark.parametrize("flag", ["--kv-cache-dtype", "--kv-dtype"])
def test_sweep_takes_the_kv_cache_dtype_flag_of_run_and_bench(flag, tmp_path, capsys):
    code, out, err = run_cli(["sweep", flag, "fp16", "--out", tmp_path / "sw"], capsys)
    assert code == 2 and "--kv-cache-dtype 'fp16' is not supported" in err and not (tmp_path / "sw").exists()


def test_top_p_or_top_k_without_temperature_is_refused(capsys):
    code, out, err = run_cli(["run", "--prompt", "hi", "--max-new-tokens", "1", "--top-p", "0.5", "--json"], capsys)
    assert code == 2 and out == "" and "--top-p applies to sampling (--temperature > 0)" in err
    code, out, err = run_cli(["run", "--prompt", "hi", "--max-new-tokens", "1", "--top-p", "0.5",
                              "--temperature", "0.7", "--json"], capsys)
    assert code == 0 and "--top-p" not in err


def test_shared_option_helps_say_what_the_options_do(capsys):
    """--dtype's help names every accepted alias and what auto picks; --random-weights takes a
    checkpoint directory's shapes as well as a preset's."""
    from salactl.options import DTYPE_HELP
    from salactl.runtime.loader import DTYPES, resolve_dtype

    assert all(f"{name}" in DTYPE_HELP for name in DTYPES)
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32 and "float32 on CPU" in DTYPE_HELP
    code, out, err = run_cli(["run", "--model", EMBEDDED_DIR, "--random-weights", "--prompt-ids", "1,2", "-n", 1,
                              "--device", "cpu", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["model"].startswith(f"random:{EMBEDDED_DIR}")
    assert json.loads(out)["prompt_token_ids"] == [1, 2]              # --prompt-ids: no BOS added


def test_auto_dtype_is_bfloat16_on_cuda_as_the_help_says():
    """--dtype auto (or no --dtype) picks bfloat16 on a CUDA device, as DTYPE_HELP promises, not float16."""
    from salactl.options import DTYPE_HELP
    from salactl.runtime.loader import resolve_dtype

    assert "bfloat16 on CUDA" in DTYPE_HELP
    assert resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
