"""`eval ppl` and `eval passkey` on the shipped sala-nano (float32, CPU) against the test's own
computation: its own tokenization (the `tokenizers` library on tokenizer.json), windowing and
whole-sequence forwards through the plain model forward (the training backend, not the Engine's
chunked prefill and KV cache), log-softmax in float64."""

import dataclasses
import json
import math
import re
import subprocess
import sys

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer

from salactl.evaluation.passkey import ANSWER_TOKENS, passkey_trials, run_passkey
from salactl.runtime.backend_train import TrainBatch, TrainingBackend
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from salactl.runtime.tokenizer import find_tokenizer

REL = 1e-5
BOS = 1
# ~336 tokens with "<s>"/"</s>" read as characters (as --file is scored), so a 320-token window fits
TEXT = ("The river runs past the old mill, where </s> the miller keeps <s> his ledgers.\n"
        "def area(r):\n    return 3.14159 * r * r\n") * 6


@pytest.fixture(scope="module")
def nano():
    return load_model("sala-nano", "cpu", "float32").model


@pytest.fixture(scope="module")
def hf_tok():
    return HFTokenizer.from_file(str(EMBEDDED_DIR / "tokenizer.json"))


def own_ids(hf_tok, text: str) -> list[int]:
    hf_tok.encode_special_tokens = True         # special-token text is scored as its characters
    try:
        return hf_tok.encode(text, add_special_tokens=False).ids
    finally:
        hf_tok.encode_special_tokens = False


def logits64(model, ids: list[int], backend) -> torch.Tensor:
    """[len(ids), vocab] float64 logits of one whole-sequence forward."""
    batch = TrainBatch.build(model.config, 1, len(ids), backend, torch.device("cpu"))
    with torch.no_grad():
        return model(torch.tensor(ids), batch).double()


def target_nlls(model, window: list[int], backend) -> torch.Tensor:
    """-log p(window[i+1] | window[:i+1]) for every i, float64."""
    lp = torch.log_softmax(logits64(model, window, backend)[:-1], dim=-1)
    target = torch.tensor(window[1:])
    return -lp[torch.arange(len(target)), target]


def own_windows(ids: list[int], seq_len: int) -> list[list[int]]:
    """<s> + the next seq_len - 1 text tokens, back to back, the last one shorter."""
    step = seq_len - 1
    return [[BOS] + ids[s:s + step] for s in range(0, len(ids), step)]


def eval_ppl_cli(path, seq_len: int, chunk_size: int) -> dict:
    args = ["eval", "ppl", "--file", str(path), "--seq-len", str(seq_len),
            "--chunk-size", str(chunk_size), "--device", "cpu", "--dtype", "float32", "--json"]
    r = subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * abs(b)


@pytest.mark.parametrize("seq_len,chunk_size,n_windows", [(128, 512, 3), (320, 64, 2)])
def test_eval_ppl_matches_an_independent_computation(tmp_path, nano, hf_tok, seq_len, chunk_size,
                                                     n_windows):
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    rec = eval_ppl_cli(path, seq_len, chunk_size)

    ids = own_ids(hf_tok, TEXT)
    assert BOS not in ids and 2 not in ids      # "<s>"/"</s>" in the text are characters here
    windows = own_windows(ids, seq_len)
    assert len(windows) == n_windows and len(windows[-1]) < seq_len
    backend = TrainingBackend(nano.config)
    per_window = [target_nlls(nano, w, backend) for w in windows]
    count = sum(len(n) for n in per_window)
    nll = float(sum(n.sum() for n in per_window)) / count

    assert rec["tokens"] == count == len(ids) and rec["windows"] == n_windows and rec["bos"] is True
    assert close(rec["nll"], nll), (rec["nll"], nll)
    assert close(rec["ppl"], math.exp(nll)), (rec["ppl"], math.exp(nll))

    # the comparison tells apart the definitions one might get wrong
    equal_windows = sum(float(n.mean()) for n in per_window) / len(per_window)
    after_bos_unscored = float(sum(n[1:].sum() for n in per_window)) / (count - len(per_window))
    for wrong in (equal_windows, after_bos_unscored):
        assert not close(rec["nll"], wrong), wrong
    if seq_len > nano.config.sparse_config.dense_len:
        # the first window reaches InfLLM-V2 sparse attention, and it changes the scores
        sparse = dataclasses.replace(nano.config.sparse_config, dense_len=seq_len + 1)
        dense = TrainingBackend(nano.config.replace(sparse_config=sparse))
        dense_nll = float(sum(target_nlls(nano, w, dense).sum() for w in windows)) / count
        assert not close(rec["nll"], dense_nll), dense_nll


def own_stop_ids(hf_tok) -> set[int]:
    """config.json's and generation_config.json's eos_token_id, </s> and <|im_end|>."""
    ids = {hf_tok.token_to_id("</s>"), hf_tok.token_to_id("<|im_end|>")}
    for name in ("config.json", "generation_config.json"):
        eos = json.loads((EMBEDDED_DIR / name).read_text())["eos_token_id"]
        ids |= set(eos if isinstance(eos, list) else [eos])
    return ids


def own_greedy_answer(model, hf_tok, prompt: list[int], max_new: int) -> str:
    """Argmax of a whole-sequence forward per step, up to `max_new` tokens or a stop id (kept, as
    decode drops it)."""
    backend, stop, ids = TrainingBackend(model.config), own_stop_ids(hf_tok), list(prompt)
    for _ in range(max_new):
        ids.append(int(logits64(model, ids, backend)[-1].argmax()))
        if ids[-1] in stop:
            break
    return hf_tok.decode(ids[len(prompt):], skip_special_tokens=True)


def own_pass(answer: str, key: str) -> bool:
    """The answer's leading run of digits (after any whitespace) is the key."""
    m = re.match(r"\s*(\d+)", answer)
    return m is not None and m.group(1) == key


def test_eval_passkey_scores_each_trial_by_the_greedy_answer(nano, hf_tok):
    tok = find_tokenizer(None, EMBEDDED_DIR)
    # one trial a cell, so each row is one trial; 300 tokens > dense_len 256 reach the sparse path
    prompts = passkey_trials(tok, [80, 300], [0.25, 0.75], 1, seed=0)
    # the same prompts asked for the key less its last digit: "12345" must not count as "1234"
    truncated = [{**p, "key": p["key"][:-1]} for p in prompts]
    rows = run_passkey(nano, tok, prompts, model_dir=EMBEDDED_DIR)
    reported = [row["correct"] == 1 for row in rows]
    reported_truncated = [run_passkey(nano, tok, [p], model_dir=EMBEDDED_DIR)[0]["correct"] == 1
                          for p in truncated]

    answers = [own_greedy_answer(nano, hf_tok, p["ids"], ANSWER_TOKENS) for p in prompts]
    for p in prompts:
        assert f"The pass key is {p['key']}." in hf_tok.decode(p["ids"])
    mine = [own_pass(a, p["key"]) for a, p in zip(answers, prompts)]
    mine_truncated = [own_pass(a, p["key"]) for a, p in zip(answers, truncated)]
    assert reported == mine, list(zip(answers, [p["key"] for p in prompts], reported))
    assert reported_truncated == mine_truncated, answers
    assert True in mine + mine_truncated and False in mine + mine_truncated   # both outcomes occur
