"""Chat templates as transformers renders them: the checkpoint's chat_template.jinja, else
tokenizer_config.json's "chat_template", compiled like `_compile_jinja_template` (sandboxed,
immutable, trim_blocks, lstrip_blocks, loop controls, {% generation %}, raise_exception, strftime_now,
tojson).
ChatML is only the fallback for a checkpoint without a template."""

from __future__ import annotations

import json
from pathlib import Path

from salactl.errors import TokenizerError

CHATML_NOTE = ("the checkpoint has no chat template (chat_template.jinja or tokenizer_config.json's "
               "chat_template); --chat uses ChatML")


CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")


def chatml(messages: list[dict], add_generation_prompt: bool = True) -> str:
    start, end = CHATML_MARKERS
    text = "".join(f"{start}{m['role']}\n{m['content']}{end}\n" for m in messages)
    return text + (f"{start}assistant\n" if add_generation_prompt else "")


def read_chat_template(directory: Path, cfg: dict, cfg_file: Path) -> dict[str, tuple[str, str]]:
    """The checkpoint's chat templates by name, each with where it is from: chat_template.jinja beside
    tokenizer.json (as "default"), else tokenizer_config's "chat_template": a string ("default"), or a
    list of {"name", "template"} as transformers keeps it (the name picks it: see pick_template).
    Empty when there is none."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.exists():
        try:
            return {"default": (jinja_file.read_text(encoding="utf-8"), str(jinja_file))}
        except (OSError, UnicodeDecodeError) as e:
            raise TokenizerError(f"cannot read {jinja_file} ({one_line(e)})") from None
    t = cfg.get("chat_template")
    if t is None:
        return {}
    if isinstance(t, str):
        return {"default": (t, f"{cfg_file} (chat_template)")}
    if not isinstance(t, list) or not t or not all(
            isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("template"), str) for d in t):
        raise TokenizerError(f"{cfg_file} has a chat_template that is neither a string nor a list of "
                             "{\"name\": ..., \"template\": ...} strings; fix or remove it")
    return {d["name"]: (d["template"], f"{cfg_file} (chat_template \"{d['name']}\")") for d in t}


def pick_template(names, tools, cfg_file: Path) -> str:
    """Which of the named templates renders a request, as transformers picks it: "tool_use" when
    tools are given (not None) and there is one, else "default"; a TokenizerError when neither is there."""
    if tools is not None and "tool_use" in names:
        return "tool_use"
    if "default" in names:
        return "default"
    fix = ("pass tools (--chat-template-kwargs 'tools=[...]') to use \"tool_use\", or name a template \"default\""
           if "tool_use" in names else "name the one to use \"default\"")
    raise TokenizerError(f"{cfg_file} has chat templates {', '.join(json.dumps(n) for n in sorted(names))}, none "
                         f"named \"default\" (used unless tools are given and \"tool_use\" exists); {fix}")


def compile_template(template: str, source: str):
    """The template compiled as the module docstring says; a syntax error is a TokenizerError."""
    from datetime import datetime

    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise TokenizerError("chat templates need jinja2; pip install jinja2") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Generation(jinja2.ext.Extension):
        """HF's {% generation %}...{% endgeneration %}, which marks the assistant's text for
        return_assistant_tokens_mask (AssistantTracker): rendered as its body, as HF does when it
        is not tracking."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, Generation])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise TokenizerError(f"the chat template of {source} is not valid jinja ({one_line(e)})") from None


def one_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]
