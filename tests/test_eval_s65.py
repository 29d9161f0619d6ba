"""`salactl eval`'s checks that need only the tokenizer and the options run before the model's weights
load (slow for a 9B model): shown on a checkpoint whose weights file is truncated, which any load
refuses (exit 4), so an error other than that one came first (session 65)."""

import shutil

import pytest

from conftest import run_cli
from salactl.runtime.loader import EMBEDDED_DIR


@pytest.fixture(scope="module")
def unloadable(tmp_path_factory):
    """sala-nano with its config and tokenizer whole and each weights file cut to 1,000 bytes."""
    path = tmp_path_factory.mktemp("ckpt") / "nano"
    shutil.copytree(EMBEDDED_DIR, path)
    for weights in path.glob("*.safetensors"):
        with open(weights, "r+b") as f:
            f.truncate(1000)
    return path


def _eval(capsys, *args) -> tuple[int, str]:
    """(exit code, the error line) of `salactl eval ARGS`, which must fail with one error line (after
    any warnings) and print nothing on stdout."""
    code, out, err = run_cli(["eval", *map(str, args), "--device", "cpu"], capsys)
    *warnings, last = err.strip().splitlines()
    assert out == "" and all(w.startswith("warning: ") for w in warnings), err
    return code, last


def test_the_weights_are_unloadable(unloadable, capsys):
    code, err = _eval(capsys, "passkey", "--model", unloadable, "--lengths", 64, "--depths", 0.5, "--trials", 1)
    assert code == 4 and "not a complete safetensors file" in err


def test_a_passkey_length_too_short_is_refused_before_loading(unloadable, capsys):
    code, err = _eval(capsys, "passkey", "--model", unloadable, "--lengths", "10,256", "--trials", 1)
    assert code == 2
    assert err.startswith("error: passkey length 10 is too short; the prompt needs at least 62 tokens"), err


@pytest.mark.parametrize("command", [["passkey"], ["ppl", "--max-tokens", "8", "--seq-len", "8"]])
def test_a_missing_tokenizer_is_refused_before_loading(unloadable, tmp_path, capsys, command):
    code, err = _eval(capsys, *command, "--model", unloadable, "--tokenizer", tmp_path / "none")
    assert code == 5 and "no tokenizer.json at" in err, err


def test_a_text_too_short_to_score_is_refused_before_loading(unloadable, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    code, err = _eval(capsys, "ppl", "--model", unloadable, "--file", tmp_path / "empty.txt")
    assert code == 7 and "is too short to score: it has 0 token(s)" in err, err


def test_a_window_too_large_for_memory_is_refused_before_loading(unloadable, capsys):
    """The whole held-out split (93,344 tokens) in one window and one chunk: its attention scores
    and logits take some 100 GiB, counted with the weights still to load."""
    code, err = _eval(capsys, "ppl", "--model", unloadable, "--max-tokens", 0, "--seq-len", 1 << 20,
                      "--chunk-size", 1 << 20)
    assert code == 11 and err.startswith("error: eval ppl (the longest window's prefill"), err
