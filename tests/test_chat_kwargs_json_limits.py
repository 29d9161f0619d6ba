"""--chat-template-kwargs values that json.loads refuses with something other than a JSONDecodeError (a
number past int()'s digit limit, nesting past the recursion limit) are the same one-line usage error."""

import pytest

from conftest import run_cli


@pytest.mark.parametrize("value,why", [("1" * 5000, "a number too long"), ("[" * 30000 + "]" * 30000, "nested too deeply")])
def test_json_that_python_cannot_hold_is_a_one_line_usage_error(capsys, value, why):
    code, _, err = run_cli(["run", "--prompt", "hi", "-n", "1", "--device", "cpu", "--chat",
                            "--chat-template-kwargs", f"big={value}"], capsys)
    assert code == 2 and f"is not JSON ({why})" in err and len(err.strip().splitlines()) == 1, err
    assert len(err) < 300
