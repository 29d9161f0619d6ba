"""Chat templates as transformers renders them: the checkpoint's chat_template.jinja, else
tokenizer_config.json's "chat_template", compiled like `_compile_jinja_template` (sandboxed,
immutable, trim_blocks, lstrip_blocks, loop controls, {% generation %}, raise_exception, strftime_now,
tojson).
ChatML is only the fallback for a checkpoint without a template."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from salactl.errors import TokenizerError
from salactl.runtime.json_file import cannot_read, read_side_file
from salactl.runtime.template_bounds import (FILTER_SIZES, INPUT_SHARE, MAX_RESULT, METER, Meter, as_int,
                                             binop_size, bounded_call, current_meter, finalize, measure,
                                             method_size)

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
    bound of those above, a bug in the template) is a one-line TokenizerError naming `source`."""
    from datetime import datetime

    try:
        import jinja2
        import jinja2.ext
        from jinja2.compiler import CodeGenerator
        from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range
        from jinja2.utils import _PassArg, generate_lorem_ipsum, pass_context
    except ImportError:
        raise TokenizerError("chat templates need jinja2; pip install jinja2") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def bounded_range(*args):
        r = safe_range(*args)
        current_meter().take_range(len(r))
        return r

    def lipsum(n=5, html=True, min=20, max=100):
        current_meter().fits(as_int(n) * (as_int(max) * 16 + 32), "lipsum()'s result")
        return generate_lorem_ipsum(n, html, min, max)

    class Generation(jinja2.ext.Extension):
        """HF's {% generation %}...{% endgeneration %}, which marks the assistant's text for
        return_assistant_tokens_mask (AssistantTracker): rendered as its body, as HF does when it
        is not tracking."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node, frame):
            # `~` is compiled to jinja2.runtime's str_join, which no environment method sees
            self.write("environment.bounded_concat(context, (")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """Every way a template builds a value goes through the render's Meter: operators, `~`,
        filters, method and function calls, the text of {{ }} and of captured blocks."""
        code_generator_class = BoundedCodeGenerator
        # intercepted operators are also not folded at compile time, where 'a' * 4000000000 would be built
        intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

        def call_binop(self, context, operator, left, right):
            meter = current_meter()
            meter.build(binop_size(operator, left, right, meter), f"a '{operator}' result")
            return super().call_binop(context, operator, left, right)

        def bounded_concat(self, context, items):
            meter = current_meter()
            meter.build(sum(meter.measure(x) for x in items), "a '~' result")
            join = jinja2.runtime.markup_join if context.eval_ctx.autoescape else jinja2.runtime.str_join
            return join(items)

        def concat(self, chunks):  # the text of {% set %}, {% filter %}, {% macro %} and call blocks
            chunks = list(chunks)
            current_meter().build(sum(map(len, chunks)), "a block's text")
            return "".join(chunks)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - as jinja2's, whose names it shadows
            method = getattr(__obj, "__wrapped__", __obj)  # str.format as wrap_str_format wraps it
            owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
            args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)  # a generator to "".join()
            size = method_size(owner, name, args, kwargs) if isinstance(owner, (str, bytes, int)) else None
            what = f"{type(owner).__name__}.{name}()'s result" if owner is not None else f"{name or 'a call'}()'s result"
            return bounded_call(lambda *a, **k: super(BoundedEnvironment, __self).call(__context, __obj, *a, **k),
                                 args, kwargs, size, what)

    def bounded_filter(name, f):
        pass_arg = _PassArg.from_obj(f)

        @pass_context  # also keeps it from being run (unbounded) while the template compiles
        def run(context, *args, **kwargs):
            given = {_PassArg.context: (context,), _PassArg.eval_context: (context.eval_ctx,),
                     _PassArg.environment: (context.environment,)}.get(pass_arg, ())
            args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)  # map(), select() ...
            size = FILTER_SIZES[name](*args, **kwargs) if name in FILTER_SIZES else None
            return bounded_call(f, given + args, kwargs, size, f"the '{name}' filter's result")
        return run

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, Generation],
                             finalize=finalize)
    env.filters["tojson"] = tojson
    env.filters = {name: bounded_filter(name, f) for name, f in env.filters.items()}
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       range=bounded_range, lipsum=lipsum)
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateError as e:
        raise TokenizerError(f"the chat template of {source} is not valid jinja ({one_line(e)})") from None
    except Exception as e:  # noqa: BLE001 - whatever an untrusted template makes the compiler do
        raise TokenizerError(f"the chat template of {source} cannot be compiled ({one_line(e)}); "
                             "fix the template") from None

    def render(variables: dict) -> str:
        meter = Meter(MAX_RESULT + INPUT_SHARE * measure(variables, float("inf")))
        token = METER.set(meter)
        try:
            text, n = [], 0
            for chunk in compiled.generate(variables):  # stopped at the limit, not after building it all
                n += len(chunk)
                meter.fits(n, "the rendered prompt")
                text.append(chunk)
            return "".join(text)
        except Exception as e:  # jinja2 TemplateError, raise_exception(), a bound above, or a bug in the template
            raise TokenizerError(f"the chat template of {source} failed: {one_line(e)}") from None
        finally:
            METER.reset(token)

    return render


def one_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]
