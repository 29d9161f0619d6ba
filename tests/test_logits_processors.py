"""HF generate()'s logits processors (repetition_penalty, no_repeat_ngram_size, min_new_tokens) and
its min-p warper: against hand-written versions of HF's definitions, in both engines, and in
`salactl run` from flags and from generation_config.json."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # the GPU engine on the CPU; set before triton is first imported

from conftest import micro_model, run_cli  # noqa: E402
from test_generation_config_defaults import nano_with  # noqa: E402

from salactl.errors import UsageError  # noqa: E402
from salactl.runtime.engine import Engine  # noqa: E402
from salactl.runtime.sampling import LogitsProcessors, SamplingParams, logits_processors, sample  # noqa: E402

NEG_INF = float("-inf")


# ---- HF's definitions, written out (transformers/generation/logits_process.py) ------------------
def hf_repetition_penalty(scores, ids, penalty):
    """RepetitionPenaltyLogitsProcessor: gather the ids' scores, scale, scatter back."""
    index = torch.tensor([ids])
    score = torch.gather(scores[None], 1, index)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return scores[None].scatter(1, index, score)[0]


def hf_no_repeat_ngram(scores, ids, n):
    """NoRepeatNGramLogitsProcessor: every n-gram of ids; ban what follows the last n-1 tokens."""
    scores = scores.clone()
    if len(ids) + 1 < n:
        return scores
    grams = {}
    for gram in zip(*[ids[i:] for i in range(n)]):
        grams.setdefault(tuple(gram[:-1]), []).append(gram[-1])
    for t in grams.get(tuple(ids[len(ids) + 1 - n:]), []):
        scores[t] = NEG_INF
    return scores


def hf_min_new_tokens(scores, generated, minimum, eos):
    """MinNewTokensLengthLogitsProcessor."""
    scores = scores.clone()
    if generated < minimum:
        scores[list(eos)] = NEG_INF
    return scores


def hf_min_p_kept(scores, min_p):
    """MinPLogitsWarper (min_tokens_to_keep 1): the ids it keeps."""
    probs = torch.softmax(scores, dim=-1)
    remove = probs < min_p * probs.max()
    order = torch.argsort(scores, descending=True)
    sorted_remove = remove[order]
    sorted_remove[:1] = False
    remove = sorted_remove.scatter(0, order, sorted_remove)
    return set(torch.nonzero(~remove).flatten().tolist())


def hf_processed(scores, params, prompt, out, eos):
    """HF's processors in generate()'s order."""
    ids = prompt + out
    if params.repetition_penalty != 1.0:
        scores = hf_repetition_penalty(scores, ids, params.repetition_penalty)
    if params.no_repeat_ngram_size:
        scores = hf_no_repeat_ngram(scores, ids, params.no_repeat_ngram_size)
    return hf_min_new_tokens(scores, len(out), params.min_new_tokens, eos)


def _tied_logits(g, vocab=40):
    """Rounded to halves: ties everywhere, negative and positive."""
    return (torch.randn(vocab, generator=g) * 4).round() / 2


# ---- the processors alone ------------------------------------------------------------------------
@pytest.mark.parametrize("params", [
    SamplingParams(repetition_penalty=1.7),
    SamplingParams(repetition_penalty=0.6),          # < 1 rewards repeats
    SamplingParams(no_repeat_ngram_size=1),
    SamplingParams(no_repeat_ngram_size=2),
    SamplingParams(no_repeat_ngram_size=3),
    SamplingParams(min_new_tokens=4),
    SamplingParams(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=3),
])
def test_processors_match_hfs_definitions_step_by_step(params):
    g = torch.Generator().manual_seed(1)
    prompt = [3, 7, 3, 7, 3, 9, 9, 11]                 # ids repeated, a bigram repeated
    eos = {0, 5}
    proc = LogitsProcessors(params, prompt, eos, 40, torch.device("cpu"))
    out = []
    for _ in range(12):
        scores = _tied_logits(g)
        want = hf_processed(scores, params, prompt, out, eos)
        got = proc(scores)
        assert torch.equal(got, want), (out, got, want)
        tok = int(torch.multinomial(torch.softmax(want, -1), 1, generator=g))   # repeats come often
        proc.append(tok)
        out.append(tok)


def test_sample_applies_processors_under_greedy_and_tells_them_the_token():
    g = torch.Generator().manual_seed(2)
    params = SamplingParams(repetition_penalty=2.0, no_repeat_ngram_size=2, min_new_tokens=2)
    prompt, eos, out = [1, 2, 1], {2}, []
    proc = logits_processors(params, prompt, eos, 40, torch.device("cpu"))
    for _ in range(10):
        scores = _tied_logits(g)
        want = hf_processed(scores, params, prompt, out, eos)
        tok = sample(scores, params, None, proc)
        assert want[tok] == want.max()
        out.append(tok)
    assert proc.generated == 10 and proc.ngrams.ids == prompt + out


def test_no_processor_on_means_none_to_carry():
    assert logits_processors(SamplingParams(temperature=1.0, top_p=0.5, min_p=0.3), [1, 2], {2}, 40, "cpu") is None


def test_min_new_tokens_alone_turns_the_processors_on():
    """--min-new-tokens with no other processor still holds EOS back (it is not dropped as a no-op)."""
    params = SamplingParams(min_new_tokens=3)
    assert params.has_processors
    assert logits_processors(params, [1, 2], {2}, 40, "cpu") is not None


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.5, 1.0])
def test_min_p_keeps_what_hfs_warper_keeps(min_p):
    logits = [2.0, 2.0, 1.5, 1.0, 0.0, -1.0, 2.0 - 0.6931471805599453, -3.0]     # ties; p/pmax = 0.5 exactly
    g = torch.Generator().manual_seed(0)
    seen = {sample(torch.tensor(logits), SamplingParams(temperature=1.0, min_p=min_p), g) for _ in range(400)}
    assert seen == hf_min_p_kept(torch.tensor(logits), min_p)


def test_min_p_comes_after_top_p():
    """HF order: top_p first, then min_p on what is left (the ratio to the top is unchanged)."""
    logits = torch.tensor([3.0, 2.9, 2.0, 1.0])
    g = torch.Generator().manual_seed(0)
    seen = {sample(logits, SamplingParams(temperature=1.0, top_p=0.9, min_p=0.3), g) for _ in range(400)}
    assert seen == {0, 1, 2} & hf_min_p_kept(logits, 0.3)


@pytest.mark.parametrize("kw, words", [
    (dict(repetition_penalty=0), "repetition_penalty (--repetition-penalty) must be a finite number > 0"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty (--repetition-penalty)"),
    (dict(repetition_penalty="2"), "repetition_penalty (--repetition-penalty) must be a number"),
    (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size (--no-repeat-ngram-size) must be >= 0"),
    (dict(no_repeat_ngram_size=2.0), "no_repeat_ngram_size (--no-repeat-ngram-size) must be an integer"),
    (dict(min_new_tokens=-3), "min_new_tokens (--min-new-tokens) must be >= 0"),
    (dict(min_p=1.5), "min_p (--min-p) must be in [0, 1]"),
    (dict(min_p=-0.1), "min_p (--min-p) must be in [0, 1]"),
])
def test_bad_values_are_refused_naming_field_and_flag(kw, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        SamplingParams(**kw)


def test_min_new_tokens_past_max_new_tokens_is_allowed():
    assert SamplingParams(max_new_tokens=4, min_new_tokens=30).min_new_tokens == 30


# ---- the engines ---------------------------------------------------------------------------------
PROCESSED = [SamplingParams(max_new_tokens=14, repetition_penalty=1.4, no_repeat_ngram_size=2, min_new_tokens=6),
             SamplingParams(max_new_tokens=14, no_repeat_ngram_size=1, stop_token_ids=(9,), min_new_tokens=14,
                            ignore_eos=True),
             SamplingParams(max_new_tokens=14, temperature=0.9, min_p=0.1, repetition_penalty=1.2, seed=3)]


def _check_greedy_against_hf(engine, prompt, params, eos):
    """Each greedy token of the engine is the top of HF's processed logits at its step (the logits
    from one prefill of prompt + output, the reference engine's)."""
    res = engine.generate(prompt, params)
    out = res.output_token_ids
    ref = Engine(micro_model())
    logits = ref.prefill(ref.new_sequence(), prompt + out, all_logits=True)
    for i, tok in enumerate(out):
        want = hf_processed(logits[len(prompt) - 1 + i], params, prompt, out[:i], eos)
        assert want[tok] >= want.max() - 1e-4, (i, tok, int(want.argmax()))
        assert want[tok] > NEG_INF
    return out


def _prompt():
    return [5, 17, 5, 17, 40, 41, 5, 17, 99, 3, 3, 3]


@pytest.mark.parametrize("params", PROCESSED[:2])
def test_cpu_engine_applies_the_processors_greedily(params):
    eos = set(params.stop_token_ids) | (set() if params.ignore_eos else {2})
    out = _check_greedy_against_hf(Engine(micro_model()), _prompt(), params, eos)
    plain = Engine(micro_model()).generate(_prompt(), SamplingParams(max_new_tokens=14)).output_token_ids
    assert out != plain


def _gpu_engine():
    pytest.importorskip("triton")
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the GPU engine on the CPU under Triton's interpreter (test_gpu_*.py: CUDA)")
    from salactl.runtime.gpu.engine import GPUEngine

    return GPUEngine(micro_model(), "cpu", max_running_requests=4, chunk_size=32, kv_tokens=1024)


def test_gpu_engine_applies_the_processors_as_the_cpu_engine_does():
    """Greedy and sampled requests with processors, batched next to a plain greedy one (which
    carries none and keeps the batched argmax): each gives the reference engine's tokens."""
    engine = _gpu_engine()
    requests = [(_prompt(), SamplingParams(max_new_tokens=14)), *((_prompt(), p) for p in PROCESSED)]
    rids = [engine.submit(p, prm) for p, prm in requests]
    assert [engine.requests[r].processors is None for r in rids] == [True, False, False, False]
    for _ in engine.events():
        pass
    got = [engine.result(r).output_token_ids for r in rids]
    want = [Engine(micro_model()).generate(p, prm).output_token_ids for p, prm in requests]
    assert got == want
    assert got[1] != got[0]


# ---- salactl run ----------------------------------------------------------------------------------
def _bigram_repeats(ids):
    grams = list(zip(ids, ids[1:]))
    return len(grams) - len(set(grams))


def _run(capsys, *args):
    code, out, err = run_cli(["run", "--prompt", "def fibonacci(n):", "--device", "cpu", "--json",
                              "--no-op-profile", *map(str, args)], capsys)
    assert code == 0, err
    return json.loads(out), err


def test_no_repeat_ngram_size_from_generation_config_stops_repeated_bigrams(tmp_path, capsys):
    plain, _ = _run(capsys, "-n", "40", "--ignore-eos")
    assert _bigram_repeats(plain["prompt_token_ids"] + plain["output_token_ids"]) > 0    # e.g. 295,517
    model = nano_with(tmp_path, no_repeat_ngram_size=2, max_new_tokens=40)
    rec, err = _run(capsys, "--model", model, "--ignore-eos")
    assert _bigram_repeats(rec["prompt_token_ids"] + rec["output_token_ids"]) == 0
    assert rec["sampling"]["no_repeat_ngram_size"] == 2
    assert rec["sampling_source"]["no_repeat_ngram_size"] == "generation_config"
    assert "no_repeat_ngram_size 2" in err


def test_flags_override_the_files_processor_settings(tmp_path, capsys):
    model = nano_with(tmp_path, repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=30, min_p=0.2)
    rec, _ = _run(capsys, "--model", model, "-n", "30", "--repetition-penalty", "1", "--no-repeat-ngram-size", "0",
                  "--min-new-tokens", "0", "--out", tmp_path / "runs")
    s = rec["sampling"]
    assert (s["repetition_penalty"], s["no_repeat_ngram_size"], s["min_new_tokens"], s["min_p"]) == (1.0, 0, 0, 0.0)
    assert {k: rec["sampling_source"][k] for k in ("repetition_penalty", "no_repeat_ngram_size", "min_new_tokens",
                                                   "min_p")} == {"repetition_penalty": "cli", "no_repeat_ngram_size":
                                                                 "cli", "min_new_tokens": "cli", "min_p": "default"}
    plain, _ = _run(capsys, "-n", "30")
    assert rec["output_token_ids"] == plain["output_token_ids"]
    knobs = [json.loads(line)["knobs"] for line in (tmp_path / "runs" / "records.jsonl").read_text().splitlines()]
    assert all(k["repetition_penalty"] == 1.0 and k["min_p"] == 0.0 for k in knobs)
    # the file's values alone (greedy: its min_p is not read, as top_p is not)
    filed, _ = _run(capsys, "--model", model, "-n", "30")
    s = filed["sampling"]
    assert (s["repetition_penalty"], s["no_repeat_ngram_size"], s["min_new_tokens"], s["min_p"]) == (1.5, 2, 30, 0.0)
    assert filed["output_token_ids"] != plain["output_token_ids"]


def test_min_p_is_refused_under_greedy_decoding(capsys):
    """As --top-p and --top-k are: greedy from the flag or from sala-nano's generation_config.json."""
    code, _, err = run_cli(["run", "--prompt", "hi", "--device", "cpu", "--min-p", "0.1", "-t", "0"], capsys)
    assert code == 2
    assert err.strip() == ("error: --min-p applies to sampling (--temperature > 0), not greedy decoding; "
                           "add --temperature T, or drop it")
    code, _, err = run_cli(["run", "--prompt", "hi", "--device", "cpu", "--min-p", "0.1", "--top-p", "0.5"], capsys)
    assert code == 2
    assert err.strip() == ("error: --top-p, --min-p apply to sampling (--temperature > 0), not greedy decoding "
                           "(greedy from the checkpoint's generation_config.json); add --temperature T, or drop them")


def test_an_unapplied_generation_setting_is_warned_about(tmp_path):
    model = nano_with(tmp_path, typical_p=0.9, num_beams=1, suppress_tokens=[])    # the last two neutral
    p = subprocess.run([sys.executable, "-m", "salactl", "run", "--model", str(model), "--prompt", "hi", "-n", "2",
                        "--device", "cpu", "--no-op-profile"], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("warning:") == 1, p.stderr
    assert ("warning: the checkpoint's generation_config.json sets typical_p 0.9, which salactl does not apply; "
            "the run goes on without it") in p.stderr
