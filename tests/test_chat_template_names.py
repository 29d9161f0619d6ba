"""Chat templates as transformers keeps them: tokenizer_config.json's chat_template may be a list of
{"name", "template"}, and a request takes "tool_use" when it gives tools, else "default"; and
--chat-template-kwargs are template variables of any name (system, user, self ...), as HF
apply_chat_template passes its extra kwargs, never Python arguments that could collide."""

import json
import shutil
from pathlib import Path

import pytest

from salactl.errors import TokenizerError, UsageError
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.tokenizer import Tokenizer
from conftest import run_cli

MESSAGES = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
DEFAULT = MESSAGES + "{{ '<|im_start|>assistant\\n' }}"
TOOL_USE = MESSAGES + "{{ 'tools ' + (tools | tojson) + '\\n<|im_start|>assistant\\n' }}"
VARIABLES = MESSAGES + "{{ 'system=' + (system | string) + ' user=' + (user | string) + '\\n' }}"


def nano_with_templates(tmp_path: Path, templates) -> Path:
    """sala-nano (weights linked) whose tokenizer_config.json has `templates` as its chat_template."""
    d = tmp_path / "nano"
    shutil.copytree(EMBEDDED_DIR, d, ignore=shutil.ignore_patterns("*.safetensors"))
    for f in EMBEDDED_DIR.glob("*.safetensors"):
        (d / f.name).symlink_to(f)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": templates}))
    return d


def named(**templates) -> list[dict]:
    return [{"name": name, "template": t} for name, t in templates.items()]


def run(capsys, model: Path, *args) -> tuple[int, str, str]:
    return run_cli(["run", "--model", model, "--prompt", "hi", "-n", "1", "--device", "cpu", "--chat", "--json",
                    *args], capsys)


def prompt_text(tok: Tokenizer, out: str) -> str:
    return tok.decode(json.loads(out)["prompt_token_ids"], skip_special=False)


@pytest.mark.parametrize("kwarg, shown", [('system="x"', "system=x user="), ("user=1", "system= user=1")])
def test_template_kwargs_named_like_chat_ids_arguments_reach_the_template(tmp_path, capsys, kwarg, shown):
    d = nano_with_templates(tmp_path, VARIABLES)
    code, out, err = run(capsys, d, "--system", "S", "--chat-template-kwargs", kwarg)
    assert code == 0, err
    # --system is the system message; a `system` kwarg is a variable of the template, as in HF
    assert prompt_text(Tokenizer(d), out).endswith("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                                                   + shown + "\n")


def test_a_template_kwarg_named_self_renders(tmp_path, capsys):
    code, _, err = run(capsys, nano_with_templates(tmp_path, DEFAULT), "--chat-template-kwargs", "self=1")
    assert code == 0, err


def test_chat_ids_takes_the_variables_as_one_dict(tmp_path):
    tok = Tokenizer(nano_with_templates(tmp_path, VARIABLES))
    ids = tok.chat_ids("hi", system="S", template_kwargs={"system": "x", "user": 2, "self": 3})
    assert tok.decode(ids, skip_special=False).endswith("user\nhi<|im_end|>\nsystem=x user=2\n")
    with pytest.raises(UsageError, match="^template_kwargs must be a dict of template variables by name"):
        tok.chat_ids("hi", template_kwargs=["system"])


def test_tools_pick_the_tool_use_template(tmp_path, capsys):
    d = nano_with_templates(tmp_path, named(default=DEFAULT, tool_use=TOOL_USE))
    tok = Tokenizer(d)
    code, out, err = run(capsys, d)
    assert code == 0, err
    assert prompt_text(tok, out) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    code, out, err = run(capsys, d, "--chat-template-kwargs", 'tools=[{"name": "f"}]')
    assert code == 0, err
    assert prompt_text(tok, out) == '<|im_start|>user\nhi<|im_end|>\ntools [{"name": "f"}]\n<|im_start|>assistant\n'
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages, tools=[]).startswith("<|im_start|>user\nhi<|im_end|>\ntools []")
    assert "tools" not in tok.apply_chat_template(messages, tools=None)     # None is no tools, as in HF


def test_tools_without_a_tool_use_template_take_the_default(tmp_path):
    tok = Tokenizer(nano_with_templates(tmp_path, named(default=DEFAULT, other=TOOL_USE)))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_only_tool_use_renders_with_tools_and_names_the_templates_without(tmp_path, capsys):
    d = nano_with_templates(tmp_path, named(tool_use=TOOL_USE))
    code, out, err = run(capsys, d, "--chat-template-kwargs", "tools=[]")
    assert code == 0, err
    assert prompt_text(Tokenizer(d), out).endswith("tools []\n<|im_start|>assistant\n")
    code, _, err = run(capsys, d)
    assert code == 5 and len(err.strip().splitlines()) == 1, err
    assert f'{d}/tokenizer_config.json has chat templates "tool_use", none named "default"' in err
    assert "pass tools (--chat-template-kwargs 'tools=[...]') to use \"tool_use\"" in err


def test_no_template_for_the_request_names_them_all(tmp_path):
    tok = Tokenizer(nano_with_templates(tmp_path, named(rag=DEFAULT, chat=DEFAULT)))
    with pytest.raises(TokenizerError, match='has chat templates "chat", "rag", none named "default" .*; name '
                                             'the one to use "default"$'):
        tok.chat_ids("hi", template_kwargs={"tools": []})


def test_a_failing_named_template_is_named(tmp_path):
    tok = Tokenizer(nano_with_templates(tmp_path, named(default=DEFAULT, tool_use="{{ raise_exception('no') }}")))
    with pytest.raises(TokenizerError, match='tokenizer_config.json \\(chat_template "tool_use"\\) failed: no$'):
        tok.chat_ids("hi", template_kwargs={"tools": []})


@pytest.mark.parametrize("templates", [[], [{"name": "default"}], ["x"], 5, [{"name": 1, "template": "x"}]])
def test_a_malformed_template_list_is_refused_at_load(tmp_path, templates):
    d = nano_with_templates(tmp_path, templates)
    with pytest.raises(TokenizerError, match="has a chat_template that is neither a string nor a list of"):
        Tokenizer(d)


def test_templates_render_with_hfs_trim_blocks_and_lstrip_blocks():
    """As in HF apply_chat_template, a block tag's own line (indent and newline) leaves nothing in the prompt."""
    from salactl.runtime.chat_template import compile_template

    t = '{% for m in messages %}\n  {% if m.role == "user" %}\n<u>{{ m.content }}\n  {% endif %}\n{% endfor %}'
    render = compile_template(t, "x")
    assert render({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}) == "<u>a\n<u>b\n"


def test_tojson_in_a_template_keeps_non_ascii_text_as_is():
    """Tools rendered with `| tojson` keep "café" readable (HF's ensure_ascii=False), not "caf\\u00e9"."""
    from salactl.runtime.chat_template import compile_template

    assert compile_template("{{ tools | tojson }}", "x")({"tools": [{"d": "café"}]}) == '[{"d": "café"}]'
