"""A checkpoint's chat template is untrusted code: however it grows text (an operator, `~`, a filter,
a string method, a block's or the render's own text), one render stops quickly at a bound with a
one-line TokenizerError, while templates of real checkpoints, on long prompts too, render."""

import time

import pytest

from salactl.errors import TokenizerError
from salactl.runtime.chat_template import compile_template

DOUBLE = "{% set ns = namespace(s='ab ') %}{% for i in range(40) %}{% set ns.s = ns.s OP ns.s %}{% endfor %}{{ ns.s }}"


@pytest.mark.parametrize("template, bound", [
    (DOUBLE.replace("OP", "~"), "a '~' result"),
    (DOUBLE.replace("OP", "+"), "a '+' result"),
    ("{{ '%02000000000d' % 1 }}", "a '%' result"),
    ("{{ 'ab'|center(40000000) }}", "the 'center' filter's result"),
    ("{{ ('a\\n' * 100000)|indent(100000) }}", "the 'indent' filter's result"),
    ("{{ ('a ' * 100000)|wordwrap(1, wrapstring='x' * 1000) }}", "the 'wordwrap' filter's result"),
    ("{{ '%999999999s'|format(1) }}", "the 'format' filter's result"),
    ("{{ (['a'] * 100000)|join('x' * 100000) }}", "the 'join' filter's result"),
    ("{{ ('a' * 100000)|replace('a', 'b' * 100000) }}", "the 'replace' filter's result"),
    ("{{ [[[1]]]|tojson(indent=10**9) }}", "the 'tojson' filter's result"),
    ("{{ 'x'.ljust(2000000000) }}", "str.ljust()'s result"),
    ("{{ 'x'.rjust(2000000000) }}", "str.rjust()'s result"),
    ("{{ 'x'.center(2000000000) }}", "str.center()'s result"),
    ("{{ '1'.zfill(2000000000) }}", "str.zfill()'s result"),
    ("{{ ('\\t' * 1000).expandtabs(10**6) }}", "str.expandtabs()'s result"),
    ("{{ ('x' * 100000).join(['a'] * 100000) }}", "str.join()'s result"),
    ("{{ ('a' * 100000).replace('a', 'b' * 100000) }}", "str.replace()'s result"),
    ("{{ '{:>999999999}'.format(1) }}", "str.format()'s result"),
    ("{{ '{:>{}}'.format(1, 999999999) }}", "str.format()'s result"),
    ("{{ (1).to_bytes(10**9, 'big') }}", "int.to_bytes()'s result"),
    ("{{ lipsum(10**6, max=10**6) }}", "lipsum()'s result"),
    # a list holding itself twice, 40 times over: small in memory, 2**40 items as text
    ("{% set ns = namespace(l='ab') %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
     "a value"),
    ("{% set x %}{% for i in range(100000) %}" + "y" * 1000 + "{% endfor %}{% endset %}{{ x|length }}",
     "a block's text"),
    ("{% for i in range(100000) %}" + "y" * 1000 + "{% endfor %}", "the rendered prompt"),
    ("{% for i in range(1000) %}{% set x = 'a' * 9000000 %}{% endfor %}", "the template builds over"),
])
def test_a_template_growing_text_past_the_bounds_fails_fast_naming_the_bound(template, bound):
    started = time.monotonic()
    with pytest.raises(TokenizerError) as e:
        compile_template(template, "t.jinja")({"messages": [{"role": "user", "content": "hi"}]})
    assert time.monotonic() - started < 60      # up to 2.5 s seen on a loaded 2-core machine; unbounded: minutes
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("the chat template of t.jinja failed: ") and bound in msg, msg
    assert "characters, items or bits" in msg


QWEN_LIKE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- set ns = namespace(last=messages|length - 1) %}"
    "{%- for message in messages %}{%- set content = message.content | trim %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA_LIKE = (
    "{{- bos_token }}{%- set date_string = strftime_now('%d %b %Y') %}"
    "{%- for t in tools or [] %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}"
    "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{{- '%s|%05d|%-3s' % ('a', 7, 'b') }}{{- '{}={:>4}'.format('k', 'v') }}{{- messages|map(attribute='role')|join(',') }}"
    "{{- ';' + '|'.join(messages|map(attribute='role')) }}")


# Each is refused before the value is built, by its own estimate: the message names the operation as
# "... would be over", where a check after the call says "is over" and {{ }}'s says "a {{ }} value".
# The sizes keep the value, built without the estimate, small enough to build (and refuse) quickly.
@pytest.mark.parametrize("template, bound", [
    ("{% set ns = namespace(x=3) %}{% for i in range(24) %}{% set ns.x = ns.x * ns.x %}{% endfor %}done",
     "a '*' result"),
    ("{{ '%*d' % (10**8, 1) }}", "a '%' result"),
    ("{% set x = '%*d' % (10**8, 1) %}done", "a '%' result"),
    ("{{ '%.99999999d' % 1 }}", "a '%' result"),
    ("{{ '{x:>{w}}'.format_map({'x': 1, 'w': 10**8}) }}", "str.format_map()'s result"),
    ("{{ ('a' * 100).replace('', 'b' * 10**6) }}", "str.replace()'s result"),
    ("{{ ('a' * 1000).translate({97: 'b' * 10**5}) }}", "str.translate()'s result"),
    ("{{ [[[[[[[[[['a' * 10**6]]]]]]]]]]|pprint }}", "the 'pprint' filter's result"),
    ("{{ ['a']|batch(2 * 10**7, fill_with='x') }}", "the 'batch' filter's result"),
    ("{{ ['a']|slice(10**9) }}", "the 'slice' filter's result"),
    ("{{ ([['a' * 1000]] * 1000)|sum(start=[]) }}", "the 'sum' filter's result"),  # quadratic copying
    ("{{ ('www.a.b ' * 20000)|urlize(target='t' * 1000) }}", "the 'urlize' filter's result"),
    ("{{ ('\\t' * 2000000).expandtabs() }}", "str.expandtabs()'s result"),
    ("{{ {('k' * 2000000): 1}|tojson(indent=10) }}", "the 'tojson' filter's result"),
    ("{{ [[[[[[[[[[['a' * 1000]]]]]]]]]]]|tojson(indent=1000) }}", "the 'tojson' filter's result"),
    ("{% set ns = namespace(l=['a' * 10**5]) %}{% for i in range(20) %}{% set ns.l = ns.l + ns.l %}{% endfor %}done",
     "a '+' result"),
])
def test_a_growth_is_refused_by_its_estimate_before_it_is_built(template, bound):
    started = time.monotonic()
    with pytest.raises(TokenizerError) as e:
        compile_template(template, "t.jinja")({"messages": [{"role": "user", "content": "hi"}]})
    assert time.monotonic() - started < 30      # the '*' case squares to its bound first: 2-4 s seen under load
    assert f"{bound} would be over" in str(e.value), str(e.value)


def test_a_growth_with_no_estimate_is_refused_after_the_call_naming_it():
    # escaping has no estimate: only the check after the call sees ~5-fold growth; {% set %} keeps the
    # value from {{ }}'s own check
    with pytest.raises(TokenizerError) as e:
        compile_template("{% set x = ('\"' * 3000000)|e %}done", "t.jinja")({"messages": []})
    assert "the 'e' filter's result is over" in str(e.value), str(e.value)


@pytest.mark.parametrize("template", [QWEN_LIKE, LLAMA_LIKE])
def test_real_world_templates_render_a_prompt_far_past_the_fixed_bound(template):
    content = "word " * 4_000_000  # 20M characters: the bounds grow with the render's input
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "description": "é"}}}}}]
    text = compile_template(template, "t.jinja")({
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}],
        "tools": tools, "add_generation_prompt": True, "bos_token": "<s>"})
    assert content.strip() in text and '"description": "é"' in text
    if template == LLAMA_LIKE:  # join() over map()'s generator, as a filter and as str.join
        assert "system,user;system|user" in text, text[-200:]


def test_a_checkpoint_doubling_a_string_with_tilde_fails_fast_from_the_cli(tmp_path, capsys):
    from test_chat_template_names import nano_with_templates, run

    started = time.monotonic()
    code, _, err = run(capsys, nano_with_templates(tmp_path, DOUBLE.replace("OP", "~")))
    assert time.monotonic() - started < 30
    assert code == 5 and "a '~' result would be over" in err and len(err.strip().splitlines()) == 1, err
