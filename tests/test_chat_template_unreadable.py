"""A chat_template.jinja that is there but cannot be read (a dangling symlink such as a cleaned
HF-cache blob, a symlink loop) is a one-line tokenizer error (exit 5) naming it, as for
tokenizer_config.json: never taken for absent, which would silently chat in ChatML."""

import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from salactl.runtime.loader import EMBEDDED_DIR
from test_bad_inputs import one_line_error


@pytest.fixture
def nano(tmp_path) -> Path:
    return Path(shutil.copytree(EMBEDDED_DIR, tmp_path / "nano"))


def chat(model: Path, capsys):
    return run_cli(["run", "--model", model, "--prompt", "hi", "-n", "1", "--no-op-profile", "--chat"], capsys)


def test_a_dangling_chat_template_is_not_taken_for_absent(nano, capsys):
    (nano / "chat_template.jinja").symlink_to(nano / "cleaned-blob")
    code, _, err = chat(nano, capsys)
    one_line_error(code, err, 5, f"cannot read {nano / 'chat_template.jinja'} (a symlink to {nano / 'cleaned-blob'}, "
                   "which does not exist); fix or remove it")
    assert "ChatML" not in err


def test_a_chat_template_symlink_loop_is_not_taken_for_absent(nano, capsys):
    (nano / "chat_template.jinja").symlink_to("chat_template.jinja")
    code, _, err = chat(nano, capsys)
    one_line_error(code, err, 5, f"cannot read {nano / 'chat_template.jinja'}", "symbolic links", "fix or remove it")
    assert "ChatML" not in err


def test_a_chat_template_that_is_not_utf8_names_the_file(nano, capsys):
    (nano / "chat_template.jinja").write_bytes(b"caf\xe9 {{ messages }}")
    code, _, err = chat(nano, capsys)
    one_line_error(code, err, 5, f"cannot read {nano / 'chat_template.jinja'}", "'utf-8' codec", "fix or remove it")


def test_without_a_chat_template_file_the_config_template_is_used(nano, capsys):
    code, _, err = chat(nano, capsys)
    assert code == 0, err
