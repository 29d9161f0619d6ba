import pytest

from salactl.errors import UsageError
from salactl.lists import parse_list


def test_values_order_and_dedupe():
    assert parse_list(" 3, 1,3", "--x") == [3, 1, 3]
    assert parse_list("3,1,3", "--x", dedupe=True) == [3, 1]
    assert parse_list("0.5,1", "--d", float) == [0.5, 1.0]


@pytest.mark.parametrize("text,kind,minimum,message", [
    ("", int, None, "--x is empty"),
    ("1,,2", int, None, "--x takes comma-separated integers, got '1,,2'"),
    ("1,", int, None, "--x takes comma-separated integers"),
    ("1,a", float, None, "--x takes comma-separated numbers"),
    ("4,0", int, 1, "--x values must be positive, got 0"),
    ("4,-1", int, 0, "--x values must be >= 0, got -1"),
])
def test_bad_lists_are_one_line_usage_errors(text, kind, minimum, message):
    with pytest.raises(UsageError) as e:
        parse_list(text, "--x", kind, minimum)
    assert str(e.value).startswith(message)
