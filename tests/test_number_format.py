"""A measured number reads the same in bench's terminal tables and in report's markdown/CSV."""

from salactl import output
from salactl.reports.render_text import fmt as report_fmt


def test_terminal_and_report_format_numbers_alike():
    for v in (0.0, 0.000123456, 0.0123456, 1.23456, 123.456, 999.94, 1234.56, 12345.6, 99999.4, 123456.7, -4321.09):
        assert output.fmt(v) == report_fmt(v)
    assert output.fmt(12345.6) == "12345.6"            # tok/s in the tens of thousands, not 1.23e+04
    assert output.fmt(1234.56) == "1234.6"
    assert output.fmt(123.456) == "123.5"
    assert output.fmt(123456.7) == "1.235e+05"
    assert output.fmt(0.000123456) == "0.0001235"
    assert output.fmt(0.0) == "0"
