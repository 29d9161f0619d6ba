"""`salactl run --chat`: --system and --chat-template-kwargs reach the checkpoint's template (as HF
apply_chat_template's messages and **kwargs); templates HF renders ({% generation %}) render; a
template that renders nothing, a ChatML fallback without ChatML tokens, and a SentencePiece-only
tokenizer are one-line tokenizer errors (exit 5) that say what to do."""

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers, trainers

from salactl.errors import TokenizerError, UsageError
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.tokenizer import Tokenizer
from conftest import run_cli

# MiniCPM-SALA-like: a system message, and enable_thinking through the template's kwargs
THINK = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
         "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
         "{% endif %}{% endif %}")
GENERATION_TAG = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
                  "{% endgeneration %}{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                  "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def nano_tokenizer(tmp_path: Path, template: str | None) -> Path:
    """sala-nano's tokenizer files with `template` as chat_template.jinja (None: no template at all)."""
    d = tmp_path / "tok"
    d.mkdir()
    shutil.copy(EMBEDDED_DIR / "tokenizer.json", d)
    cfg = json.loads((EMBEDDED_DIR / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    if template is not None:
        (d / "chat_template.jinja").write_text(template)
    return d


def run(capsys, *args) -> tuple[int, str, str]:
    return run_cli(["run", "--prompt", "hi", "-n", "1", "--device", "cpu", *args], capsys)


def test_system_and_template_kwargs_reach_the_template(tmp_path, capsys):
    d = nano_tokenizer(tmp_path, THINK)
    code, out, err = run(capsys, "--tokenizer", d, "--chat", "--system", "Be terse.", "--chat-template-kwargs",
                         "enable_thinking=false", "--json")
    assert code == 0, err
    want = ("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    tok = Tokenizer(d)
    assert json.loads(out)["prompt_token_ids"] == tok.encode(want, add_special_tokens=False)
    # the Python API takes the template's variables as HF's **kwargs do
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages, enable_thinking=False).endswith("</think>\n\n")
    assert tok.apply_chat_template(messages).endswith("assistant\n")


@pytest.mark.parametrize("args,msg", [
    (["--system", "x"], "--system applies to --chat (the chat template); add --chat, or drop it"),
    (["--chat-template-kwargs", "enable_thinking=false"], "--chat-template-kwargs applies to --chat"),
    (["--chat", "--chat-template-kwargs", "enable_thinking"], "'enable_thinking' is not KEY=JSON_VALUE"),
    (["--chat", "--chat-template-kwargs", "=1"], "'=1' is not KEY=JSON_VALUE"),
    (["--chat", "--chat-template-kwargs", "enable_thinking=False"], "enable_thinking: 'False' is not JSON"),
])
def test_chat_options_misuse_is_one_line_exit_2(capsys, args, msg):
    code, _, err = run(capsys, *args)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_template_kwargs_without_a_template_are_refused(tmp_path, capsys):
    code, _, err = run(capsys, "--tokenizer", nano_tokenizer(tmp_path, None), "--chat",
                       "--chat-template-kwargs", "enable_thinking=false")
    assert code == 2 and "has none (--chat uses ChatML); drop them" in err and len(err.strip().splitlines()) == 1


def test_generation_tag_renders_its_body_as_hf(tmp_path):
    tok = Tokenizer(nano_tokenizer(tmp_path, GENERATION_TAG))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\nyo"
    assert tok.chat_ids("hi") == tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
                                            add_special_tokens=False)


@pytest.mark.parametrize("template", ["", "{% for m in messages %}{% endfor %}\n"])
def test_template_that_renders_nothing_is_blamed_on_the_template(tmp_path, capsys, template):
    d = nano_tokenizer(tmp_path, template)
    code, _, err = run(capsys, "--tokenizer", d, "--chat")
    assert code == 5 and len(err.strip().splitlines()) == 1, err
    assert f"the chat template of {d}/chat_template.jinja rendered no text for the prompt" in err


def test_chatml_fallback_needs_single_token_markers(tmp_path, capsys):
    d = tmp_path / "plain"
    d.mkdir()
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["hi there <|im_start|> user"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    tok.save(str(d / "tokenizer.json"))
    with pytest.raises(TokenizerError, match="lacks the ChatML markers <\\|im_start\\|>/<\\|im_end\\|> as single"):
        Tokenizer(d).chat_ids("hi")
    code, _, err = run(capsys, "--tokenizer", d, "--chat")
    assert code == 5 and "pass the prompt without --chat, or add a chat_template" in err
    assert len(err.strip().splitlines()) == 1, err        # no ChatML note before it
    assert Tokenizer(EMBEDDED_DIR).chat_ids("hi")         # sala-nano has the markers as tokens


# ---- a SentencePiece-only tokenizer --------------------------------------------------------------------
@pytest.fixture
def spm_only(tmp_path):
    d = tmp_path / "spm"
    shutil.copytree(EMBEDDED_DIR, d, ignore=shutil.ignore_patterns("*.safetensors", "tokenizer.json"))
    for f in EMBEDDED_DIR.glob("*.safetensors"):
        (d / f.name).symlink_to(f)
    (d / "tokenizer.model").write_bytes(b"\n\x0e\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")   # a protobuf, not JSON
    return d


@pytest.mark.parametrize("given", [None, ".", "tokenizer.model"])
def test_sentencepiece_only_says_how_to_convert(spm_only, capsys, given):
    args = [] if given is None else ["--tokenizer", spm_only / given]
    code, _, err = run(capsys, "--model", spm_only, *args)
    assert code == 5 and len(err.strip().splitlines()) == 1, err
    assert "is a SentencePiece model, but salactl reads only tokenizer.json; convert it: python -c " \
           f"\"from transformers import AutoTokenizer as T; T.from_pretrained('{spm_only}')" in err, err


# tools/documents are ordinary template variables (None unless given), as in HF, vLLM and SGLang
TOOLS = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
         "{% if tools is not none %}{{ 'tools ' + (tools | tojson) + '\\n' }}{% endif %}"
         "{% if documents is none %}{{ 'no documents\\n' }}{% endif %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_tools_and_documents_override_their_none_defaults(tmp_path, capsys):
    d = nano_tokenizer(tmp_path, TOOLS)
    tok = Tokenizer(d)
    messages = [{"role": "user", "content": "hi"}]
    assert "tools" not in tok.apply_chat_template(messages)
    assert tok.apply_chat_template(messages, tools=[{"name": "f"}]).endswith(
        'tools [{"name": "f"}]\nno documents\n<|im_start|>assistant\n')
    assert "no documents" not in tok.apply_chat_template(messages, documents=[{"text": "x"}])
    code, out, err = run(capsys, "--tokenizer", d, "--chat", "--chat-template-kwargs", "tools=[]",
                         "--chat-template-kwargs", "documents=null", "--json")
    assert code == 0, err
    assert json.loads(out)["prompt_token_ids"] == tok.encode(
        "<|im_start|>user\nhi<|im_end|>\ntools []\nno documents\n<|im_start|>assistant\n", add_special_tokens=False)


@pytest.mark.parametrize("kwargs,named", [
    (["add_generation_prompt=false"], "add_generation_prompt: --chat builds the messages"),
    (["messages=[]"], "messages: --chat builds"),
    (["messages=[]", "add_generation_prompt=true"], "messages or add_generation_prompt: --chat builds"),
])
def test_what_chat_sets_itself_is_not_a_template_kwarg(tmp_path, capsys, kwargs, named):
    d = nano_tokenizer(tmp_path, THINK)
    args = [a for kw in kwargs for a in ("--chat-template-kwargs", kw)]
    code, _, err = run(capsys, "--tokenizer", d, "--chat", *args)
    assert code == 2 and f"--chat-template-kwargs cannot set {named}" in err, err
    assert len(err.strip().splitlines()) == 1, err
    with pytest.raises(UsageError, match="cannot set add_generation_prompt"):
        Tokenizer(d).chat_ids("hi", template_kwargs={"add_generation_prompt": False})


def test_chatml_fallback_refuses_template_kwargs_in_python_too(tmp_path):
    tok = Tokenizer(nano_tokenizer(tmp_path, None))
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(UsageError, match=r"\(enable_thinking\) apply to the checkpoint's chat template, and it "
                                         r"has none \(--chat uses ChatML\); drop them"):
        tok.apply_chat_template(messages, enable_thinking=False)
    with pytest.raises(UsageError, match="has none"):
        tok.chat_ids("hi", template_kwargs={"tools": []})
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
