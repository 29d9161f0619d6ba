"""Chat templates as transformers renders them: the checkpoint's chat_template.jinja, else
tokenizer_config.json's "chat_template", compiled like `_compile_jinja_template` (sandboxed,
immutable, trim_blocks, lstrip_blocks, loop controls, {% generation %}, raise_exception, strftime_now,
tojson).
ChatML is only the fallback for a checkpoint without a template."""

from __future__ import annotations

import json
import os
from pathlib import Path

from salactl.errors import TokenizerError
from salactl.runtime.json_file import cannot_read, read_side_file

CHATML_NOTE = ("the checkpoint has no chat template (chat_template.jinja or tokenizer_config.json's "
               "chat_template); --chat uses ChatML")


CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
# a checkpoint's template is untrusted code: bounds on what one render may build
MAX_RESULT = 10**7          # characters or items of a "*" product, bits of a "*" or "**" integer
MAX_RANGE_ITEMS = 10**6     # items of all the range() calls of one render


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
    # lexists: a dangling or looping symlink is a template that cannot be read (an error), not a missing
    # one that silently leaves tokenizer_config's or ChatML in its place
    if os.path.lexists(jinja_file):
        return {"default": (_read_jinja(jinja_file), str(jinja_file))}
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


def _read_jinja(path: Path) -> str:
    fix = "fix or remove it"
    try:
        return read_side_file(path, TokenizerError, fix).decode("utf-8")
    except OSError as e:
        raise cannot_read(path, e, TokenizerError, fix) from None
    except UnicodeDecodeError as e:
        raise TokenizerError(f"cannot read {path} ({one_line(e)}); {fix}") from None


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
    """The template compiled as the module docstring says, as a function of the render's variables
    to the text. Anything wrong while compiling or rendering (a syntax error, raise_exception(), a
    result past MAX_RESULT or MAX_RANGE_ITEMS, a bug in the template) is a one-line TokenizerError
    naming `source`."""
    from datetime import datetime

    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
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

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        # intercepted operators are also not folded at compile time, where 'a' * 4000000000 would be built
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            if _result_size(operator, left, right) > MAX_RESULT:
                raise OverflowError(f"a '{operator}' result over {MAX_RESULT} characters, items or bits")
            return super().call_binop(context, operator, left, right)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, Generation])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateError as e:
        raise TokenizerError(f"the chat template of {source} is not valid jinja ({one_line(e)})") from None
    except Exception as e:  # noqa: BLE001 - whatever an untrusted template makes the compiler do
        raise TokenizerError(f"the chat template of {source} cannot be compiled ({one_line(e)}); "
                             "fix the template") from None

    def render(variables: dict) -> str:
        left = MAX_RANGE_ITEMS

        def bounded_range(*args):
            nonlocal left
            r = safe_range(*args)
            left -= len(r)
            if left < 0:
                raise OverflowError(f"the template's range() calls make over {MAX_RANGE_ITEMS} items in all")
            return r

        try:
            return compiled.render({**variables, "range": bounded_range})
        except Exception as e:  # jinja2 TemplateError, raise_exception(), a bound above, or a bug in the template
            raise TokenizerError(f"the chat template of {source} failed: {one_line(e)}") from None

    return render


def _result_size(operator: str, left, right) -> int:
    """The characters, items or bits `left operator right` would have ("*" or "**"); 0 where small
    by nature (floats, which overflow to an error instead)."""
    if operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            return right * max(abs(left).bit_length() - 1, 0)
        return 0
    if isinstance(left, int) and isinstance(right, int):
        return left.bit_length() + right.bit_length()
    for seq, n in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
            return len(seq) * n
    return 0


def one_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]
