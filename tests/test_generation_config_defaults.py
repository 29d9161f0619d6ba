"""`salactl run` takes its sampling and length defaults from the checkpoint's generation_config.json,
as HF generate(), vLLM and SGLang do; flags given on the command line win."""

import json
import shutil
from pathlib import Path

import pytest

from salactl.runtime.loader import EMBEDDED_DIR
from conftest import run_cli

PROMPT = ["--prompt", "def fibonacci(n):", "--device", "cpu"]     # 10 tokens with BOS
MINICPM4 = {"do_sample": True, "temperature": 0.8, "top_p": 0.8}     # what MiniCPM4-8B ships


def nano_with(tmp_path: Path, **generation) -> Path:
    """sala-nano (weights linked) whose generation_config.json is the embedded one updated with
    `generation` (None: key removed)."""
    d = tmp_path / "nano"
    shutil.copytree(EMBEDDED_DIR, d, ignore=shutil.ignore_patterns("*.safetensors"))
    for f in EMBEDDED_DIR.glob("*.safetensors"):
        (d / f.name).symlink_to(f)
    gen = json.loads((d / "generation_config.json").read_text())
    gen = {k: v for k, v in {**gen, **generation}.items() if v is not None}
    (d / "generation_config.json").write_text(json.dumps(gen))
    return d


def run_json(capsys, *args) -> tuple[dict, str]:
    code, out, err = run_cli(["run", *PROMPT, "--json", *args], capsys)
    assert code == 0, err
    return json.loads(out), err


def test_do_sample_true_samples_with_the_checkpoints_temperature_and_top_p(tmp_path, capsys):
    model = nano_with(tmp_path, **MINICPM4)
    rec, err = run_json(capsys, "--model", model, "-n", "12", "--ignore-eos", "--out", tmp_path / "runs")
    assert (rec["sampling"]["temperature"], rec["sampling"]["top_p"], rec["sampling"]["top_k"]) == (0.8, 0.8, 0)
    assert rec["sampling_source"] == {"temperature": "generation_config", "top_p": "generation_config",
                                      "top_k": "default", "max_new_tokens": "cli",
                                      "repetition_penalty": "default", "no_repeat_ngram_size": "default",
                                      "min_new_tokens": "default", "min_p": "default"}
    assert err.strip() == ("from the checkpoint's generation_config.json: temperature 0.8, top_p 0.8; "
                           "flags override")
    # the same draw as those values given as flags (seed 0 in both)
    flags, _ = run_json(capsys, "--model", model, "-n", "12", "--ignore-eos", "-t", "0.8", "--top-p", "0.8")
    assert rec["output_token_ids"] == flags["output_token_ids"]
    assert flags["sampling_source"]["temperature"] == "cli"
    knobs = [json.loads(line)["knobs"] for line in (tmp_path / "runs" / "records.jsonl").read_text().splitlines()]
    assert {(k["temperature"], k["top_p"], k["sampling_source"]["top_p"]) for k in knobs} == \
        {(0.8, 0.8, "generation_config")}


def test_flags_win_and_temperature_0_is_greedy(tmp_path, capsys):
    model = nano_with(tmp_path, **MINICPM4, top_k=5)
    greedy, err = run_json(capsys, "--model", model, "-n", "12", "--ignore-eos", "-t", "0")
    assert greedy["sampling"]["temperature"] == 0 and greedy["sampling"]["top_p"] == 1.0 and err == ""
    assert greedy["sampling_source"]["top_p"] == "default"
    embedded, _ = run_json(capsys, "-n", "12", "--ignore-eos")
    assert greedy["output_token_ids"] == embedded["output_token_ids"]
    # sampling from the checkpoint uses --seed, so it is not refused; --top-k overrides the file's
    seeded, _ = run_json(capsys, "--model", model, "-n", "4", "--seed", "5", "--top-k", "3")
    assert seeded["sampling"]["seed"] == 5 and seeded["sampling"]["top_k"] == 3
    assert seeded["sampling_source"]["top_k"] == "cli" and seeded["sampling_source"]["temperature"] == "generation_config"


def test_the_readme_job_stays_greedy_and_quiet(capsys):
    """The embedded sala-nano ships do_sample false and max_new_tokens 64, salactl's own defaults."""
    rec, err = run_json(capsys, "--max-new-tokens", "48")
    assert rec["sampling"]["temperature"] == 0 and rec["sampling_source"]["temperature"] == "generation_config"
    assert rec["sampling_source"]["max_new_tokens"] == "cli" and err == ""
    rec, _ = run_json(capsys, "--ignore-eos")
    assert len(rec["output_token_ids"]) == 64 and rec["sampling_source"]["max_new_tokens"] == "generation_config"


def test_max_length_alone_leaves_its_budget_after_the_prompt(tmp_path, capsys):
    model = nano_with(tmp_path, max_new_tokens=None, max_length=13)
    rec, err = run_json(capsys, "--model", model, "--ignore-eos")
    assert len(rec["prompt_token_ids"]) == 10 and len(rec["output_token_ids"]) == 3
    assert rec["sampling_source"]["max_new_tokens"] == "generation_config"
    assert "max_new_tokens 3 (its max_length 13 less the prompt)" in err


@pytest.mark.parametrize("flags", [["--top-p", "0.9"], ["--seed", "3"]])
def test_flags_greedy_decoding_from_the_file_ignores_are_refused(capsys, flags):
    code, _, err = run_cli(["run", *PROMPT, *flags], capsys)
    assert code == 2 and f"{flags[0]} applies to" in err and "greedy from the checkpoint's generation_config.json" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("key,value,expected", [
    ("temperature", -0.5, "a finite number >= 0"),
    ("temperature", "hot", "a finite number >= 0"),
    ("top_p", 1.5, "a number in (0, 1]"),
    ("top_p", 0, "a number in (0, 1]"),
    ("top_k", 2.5, "an integer >= 0"),
    ("do_sample", "yes", "true or false"),
    ("max_new_tokens", -1, "an integer >= 0"),
    ("max_length", 0, "an integer >= 1"),
])
def test_malformed_sampling_values_are_one_line_exit_4(tmp_path, capsys, key, value, expected):
    model = nano_with(tmp_path, **{key: value})
    code, _, err = run_cli(["run", *PROMPT, "--model", model, "-n", "1", "-t", "0.5"], capsys)
    assert code == 4 and len(err.strip().splitlines()) == 1, err
    assert f"generation_config.json has {key} = {json.dumps(value)}; expected {expected}" in err


@pytest.mark.parametrize("max_length", [10, 4])
def test_a_max_length_the_prompt_fills_is_refused_as_hf_does(tmp_path, capsys, max_length):
    """max_length no longer than the 10-token prompt leaves nothing to generate; HF generate() raises."""
    model = nano_with(tmp_path, max_new_tokens=None, max_length=max_length)
    code, out, err = run_cli(["run", *PROMPT, "--model", model], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert (f"generation_config.json has max_length {max_length}, but the prompt is 10 tokens, leaving none to "
            "generate; pass --max-new-tokens N") in err
    rec, _ = run_json(capsys, "--model", model, "-n", "2", "--ignore-eos")      # the flag wins
    assert len(rec["output_token_ids"]) == 2
    # the file's max_new_tokens takes precedence over its max_length
    rec, _ = run_json(capsys, "--model", nano_with(tmp_path / "b", max_new_tokens=2, max_length=max_length),
                      "--ignore-eos")
    assert len(rec["output_token_ids"]) == 2


@pytest.mark.parametrize("args,generation,said", [
    (["-n", "3"], {}, "the prompt plus --max-new-tokens is 13 tokens"),
    ([], {"max_new_tokens": 3}, "the prompt plus generation_config.json's max_new_tokens (--max-new-tokens "
                                "overrides it) is 13 tokens"),
    ([], {"max_new_tokens": None, "max_length": 13}, "generation_config.json's max_length (--max-new-tokens "
                                                     "overrides it) is 13 tokens"),
])
def test_past_trained_length_names_what_set_the_length(tmp_path, capsys, args, generation, said):
    model = nano_with(tmp_path, **generation)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 12}))
    _, err = run_json(capsys, "--model", model, "--ignore-eos", *args)
    assert f"warning: {said}, past the model's max_position_embeddings (12)" in err, err
