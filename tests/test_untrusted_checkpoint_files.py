"""A downloaded checkpoint directory is untrusted: side files that are devices, FIFOs, huge or
hold absurd numbers, and chat templates that would build huge values or loop for ever, are each
a one-line error with the project's exit code, never a traceback, a hang or a memory blow-up."""

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from salactl.runtime.loader import EMBEDDED_DIR

INDEX = "model.safetensors.index.json"


@pytest.fixture
def nano(tmp_path) -> Path:
    return Path(shutil.copytree(EMBEDDED_DIR, tmp_path / "nano"))


def run(d: Path, capsys, *extra):
    return run_cli(["run", "-m", d, "-p", "hi", "-n", 2, "--no-op-profile", *extra], capsys)


def one_line_error(result, expected_code, *words):
    code, _, err = result
    assert code == expected_code, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def edit_json(path: Path, **changes):
    d = json.loads(path.read_text())
    d.update(changes)
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("name,code", [("config.json", 3), ("tokenizer_config.json", 5),
                                       ("tokenizer.json", 5), ("chat_template.jinja", 5)])
def test_a_side_file_that_is_a_device_is_refused(nano, capsys, name, code):
    (nano / name).unlink(missing_ok=True)
    (nano / name).symlink_to("/dev/zero")
    one_line_error(run(nano, capsys), code, name, "is not a regular file")


@pytest.mark.parametrize("name,code", [("config.json", 3), ("tokenizer.json", 5)])
def test_a_side_file_that_is_a_fifo_is_refused_not_waited_on(nano, capsys, name, code):
    (nano / name).unlink()
    os.mkfifo(nano / name)
    one_line_error(run(nano, capsys), code, name, "is not a regular file")


def test_a_huge_json_side_file_is_refused_unread(nano, capsys):
    with open(nano / "tokenizer_config.json", "r+b") as f:
        f.truncate(65 * 2**20)                        # sparse: no 65 MiB written
    one_line_error(run(nano, capsys), 5, "tokenizer_config.json", "MiB")


def test_a_symlink_to_a_regular_file_is_followed(nano, capsys):
    """HF's cache keeps snapshots as symlinks into blobs/."""
    blob = nano.parent / "blob"
    (nano / "config.json").rename(blob)
    (nano / "config.json").symlink_to(blob)
    assert run(nano, capsys)[0] == 0


@pytest.mark.parametrize("name,code", [("config.json", 3), ("tokenizer_config.json", 5), (INDEX, 4)])
def test_an_integer_of_too_many_digits_is_a_one_line_error(nano, capsys, name, code):
    text = (nano / name).read_text().rstrip()
    (nano / name).write_text(text[:-1] + ', "x": 1' + "0" * 5000 + "}")
    one_line_error(run(nano, capsys), code, name, "too many digits")


@pytest.mark.parametrize("key", ["rope_theta", "rms_norm_eps", "scale_emb", "scale_depth", "dim_model_base"])
def test_a_float_setting_past_floats_range_is_a_config_error(nano, capsys, key):
    edit_json(nano / "config.json", **{key: 10**401})
    one_line_error(run(nano, capsys), 3, f"config.{key} must be a positive finite number")


def test_a_large_integer_rope_theta_within_floats_range_runs(nano, capsys):
    edit_json(nano / "config.json", rope_theta=10**300)      # torch cannot take it as a Python int
    code, _, err = run(nano, capsys)
    assert code == 0, err


@pytest.mark.parametrize("template", [
    "{{ 'a' * 4000000000 }}",                                    # folded at compile time unless intercepted
    "{{ [1, 2] * 10**9 }}",
    "{{ 10 ** 10000000 }}",
    "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
])
def test_a_chat_template_that_would_build_huge_values_or_loop_for_ever_is_refused(nano, capsys, template):
    (nano / "chat_template.jinja").write_text(template)
    one_line_error(run(nano, capsys, "--chat"), 5, "chat_template.jinja")


def test_a_chat_template_within_the_bounds_renders(nano, capsys):
    (nano / "chat_template.jinja").write_text(
        "{{ '-' * 3 }}{{ 2 ** 10 }}{% for i in range(1000) %}{% for j in range(100) %}{% endfor %}{% endfor %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    code, _, err = run(nano, capsys, "--chat")
    assert code == 0, err


@pytest.mark.parametrize("value", [{"name": "LlamaTokenizerFast"}, ["LlamaTokenizerFast"]])
def test_a_tokenizer_class_that_is_not_a_string_is_refused(nano, capsys, value):
    edit_json(nano / "tokenizer_config.json", tokenizer_class=value)
    one_line_error(run(nano, capsys), 5, "tokenizer_class", "expected a class name string")


def test_a_config_json_symlink_loop_is_a_config_error(nano, capsys):
    (nano / "config.json").unlink()
    (nano / "config.json").symlink_to(nano / "config.json")
    one_line_error(run(nano, capsys), 3, "config.json")


def test_an_index_that_is_a_directory_is_a_checkpoint_error(nano, capsys):
    (nano / INDEX).unlink()
    (nano / INDEX).mkdir()
    one_line_error(run(nano, capsys), 4, INDEX)


def test_quantize_sizes_only_the_checkpoints_own_files(nano, tmp_path, capsys):
    """A dangling symlink and a stray copy beside the shards are not the checkpoint: the record
    counts the index's shards, and the command does not fail over them after writing."""
    shards = set(json.loads((nano / INDEX).read_text())["weight_map"].values())
    source = sum((nano / s).stat().st_size for s in shards)
    (nano / "old.safetensors").symlink_to(tmp_path / "gone.safetensors")
    shutil.copy(nano / sorted(shards)[0], nano / "backup.safetensors")
    code, stdout, err = run_cli(["quantize", "--model", nano, "--out", tmp_path / "q", "--method", "rtn",
                                 "--device", "cpu", "--json"], capsys)
    assert code == 0, err
    rec = json.loads(stdout)
    written = sum(f.stat().st_size for f in (tmp_path / "q").glob("*.safetensors"))
    assert rec["checkpoint_bytes"] == {"source": source, "written": written}
