"""Record values as text in Markdown and CSV cells, shown as they are and run by nothing: without
pandas, so that bench's summary and --details CSV do not import it."""

from __future__ import annotations

import csv
import io
import re

from salactl.reports.records import breaks_lines

# &, < and > as entities: a label, model path or knob holding HTML (<script>) shows it as text
MD_HTML_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def md_text(text: str) -> str:
    """`text` on one Markdown line, shown as it is: control characters and line separators (a label or
    phase name edited by hand) written as escapes (\\n, \\x1b), not as the line breaks that split a
    heading or row, and HTML as text."""
    return "".join(c.encode("unicode_escape").decode("ascii") if breaks_lines(c) else c
                   for c in text).translate(MD_HTML_ESCAPES)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(v):
    """`v` for a CSV cell: a string that a spreadsheet would run as a formula (a label, a server's error
    text) starts with ' (OWASP's advice on CSV injection); numbers stay as they are, -1 included."""
    return "'" + v if isinstance(v, str) and v.startswith(FORMULA_STARTS) else v


def csv_rows(rows) -> str:
    """CSV of `rows` (the first the header), each cell through csv_cell."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerows([csv_cell(v) for v in row] for row in rows)
    return lf_records(buf.getvalue())


# a quoted field (its quotes doubled inside), or a record's end: no other " or CR LF is left unquoted
CSV_FIELD_OR_END = re.compile(r'("[^"]*(?:""[^"]*)*")|\r\n')


def lf_records(text: str) -> str:
    """CSV written with CR LF as its line terminator, each record ended in LF instead (not os.linesep:
    the same file on every OS). The writer quotes a field holding a character of its terminator and
    no other line break, so CR LF makes it quote a bare CR too, which would split a row for readers."""
    return CSV_FIELD_OR_END.sub(lambda m: m.group(1) or "\n", text)
