"""`salactl run`: bytes that are not UTF-8 in --prompt, --system or a --chat-template-kwargs string
(argv bytes Python keeps as lone surrogates, or JSON's "\\udcff") are a one-line usage error (exit 2)
naming the flag and the position in what was given, not in the rendered chat template."""

import pytest

from conftest import run_cli

FIX = "; give UTF-8 text (convert it, e.g. with iconv -f latin1 -t utf-8, or set a UTF-8 locale)"
BAD = "sy\udcffs"       # how Python hands over the argv bytes b"sy\xffs"


@pytest.mark.parametrize("args, message", [
    (["--chat", "--prompt", "hi", "--system", BAD], "--system: the text is not valid UTF-8 (byte 0xff at character offset 2)"),
    (["--chat", "--prompt", BAD], "--prompt: the text is not valid UTF-8 (byte 0xff at character offset 2)"),
    (["--prompt", BAD], "--prompt: the text is not valid UTF-8 (byte 0xff at character offset 2)"),
    (["--chat", "--prompt", "hi", "--chat-template-kwargs", f'name="{BAD}"'],
     "--chat-template-kwargs name: the text is not valid UTF-8 (byte 0xff at character offset 2)"),
    (["--chat", "--prompt", "hi", "--chat-template-kwargs", 'names={"a": ["ok", "x\\udce9"]}'],
     "--chat-template-kwargs names: the text is not valid UTF-8 (byte 0xe9 at character offset 1)"),
    (["--chat", "--prompt", "hi", "--chat-template-kwargs", 'opts={"\\udcff": 1}'],     # a key inside the value
     "--chat-template-kwargs opts: the text is not valid UTF-8 (byte 0xff at character offset 0)"),
    (["--chat", "--prompt", "hi", "--chat-template-kwargs", f"{BAD}=1"],
     "--chat-template-kwargs: the text is not valid UTF-8 (byte 0xff at character offset 2)"),
])
def test_text_that_is_not_utf8_names_its_flag(args, message, capsys):
    code, out, err = run_cli(["run", *args, "--max-new-tokens", "1", "--json"], capsys)
    assert code == 2 and out == "", err
    assert err.splitlines() == [f"error: {message}{FIX}"]


def test_utf8_system_and_template_strings_still_run(capsys):
    code, out, err = run_cli(["run", "--chat", "--prompt", "hi", "--system", "café", "--chat-template-kwargs",
                              'names={"a": ["ok", "é"]}', "--max-new-tokens", "1", "--json", "--no-op-profile"],
                             capsys)
    assert code == 0, err
