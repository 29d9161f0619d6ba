"""Bounds on what one chat-template render may build. A checkpoint's template is untrusted code, so
every value it builds is sized before (where it can grow past its arguments: operators, `~`, text
filters and str methods) or after it is made, against a per-render meter (contextvar METER).
jinja2's sandbox bounds attribute access, not sizes, hence this module."""

from __future__ import annotations

import contextvars
import re
import string
from collections.abc import Collection, Mapping

# A checkpoint's template is untrusted code: one render may build (as any one value, and as its text)
# MAX_RESULT characters, items or bits plus INPUT_SHARE times the size of its variables (a long prompt
# must still render), BUILD_SHARE times that in all, and take MAX_RANGE_ITEMS items from range().
MAX_RESULT = 10**7
INPUT_SHARE = 4
BUILD_SHARE = 10
MAX_RANGE_ITEMS = 10**6


class Meter:
    """What one render may still build: `limit` characters, items or bits in any one value (or the
    rendered text), BUILD_SHARE * limit in all, and MAX_RANGE_ITEMS items from range()."""

    def __init__(self, limit: int):
        self.limit, self.left, self.range_left = limit, BUILD_SHARE * limit, MAX_RANGE_ITEMS

    def fits(self, size: int, what: str) -> None:
        if size > self.limit:
            raise OverflowError(f"{what} would be over {self.limit} characters, items or bits")

    def build(self, size: int, what: str) -> None:
        """Checked before `what` is built: it fits and the render has not built too much in all."""
        self.fits(size, what)
        self.left -= size
        if self.left < 0:
            raise OverflowError(f"the template builds over {BUILD_SHARE * self.limit} characters, items or bits "
                                "in all")

    def measure(self, x) -> int:
        return measure(x, self.limit)

    def take_range(self, n: int) -> None:
        self.range_left -= n
        if self.range_left < 0:
            raise OverflowError(f"the template's range() calls make over {MAX_RANGE_ITEMS} items in all")


METER: contextvars.ContextVar[Meter] = contextvars.ContextVar("chat_template_meter")


def current_meter() -> Meter:
    # outside a render (a filter folded while compiling; those are refused) nothing may be large
    return METER.get(None) or Meter(MAX_RESULT)


def finalize(value):
    """Every {{ }} value, before str() makes its text: a list or dict is measured first, as its text
    may be far larger than its memory (a list holding one long string many times)."""
    meter = current_meter()
    meter.build(meter.measure(value), "a {{ }} value")
    return value


def bounded_call(fn, args, kwargs, size, what):
    """fn(*args, **kwargs) with its arguments measured (as text they must fit), `size` (its result's
    size where it can grow past its arguments' by a number or string argument) checked before it
    runs, and its result measured after."""
    meter = current_meter()
    for a in (*args, *kwargs.values()):
        meter.measure(a)
    if size is not None:
        meter.fits(size, what)
    result = fn(*args, **kwargs)
    try:
        size = meter.measure(result)
    except OverflowError:  # named as what made it, and as built already (not "would be")
        raise OverflowError(f"{what} is over {meter.limit} characters, items or bits") from None
    meter.build(size, what)
    return result


def measure(x, cap) -> int:
    return _shape(x, cap)[0]


def _shape(x, cap) -> tuple[int, int]:
    """The size of x as text, near enough (characters of a string, ~digits of an int, 2 per item of a
    list or dict plus its items'), and how deep its lists and dicts nest; an OverflowError once the
    size is past `cap`. An item held many times counts each time, as in the text, but is walked once."""
    shapes: dict[int, tuple[int, int] | None] = {}  # a list or dict's by id(); None while walking it
    stack = [(x, False)]
    while stack:
        v, walked = stack.pop()
        items = _items(v)
        if items is None or (not walked and id(v) in shapes):
            continue
        if not walked:
            shapes[id(v)] = None
            stack.append((v, True))
            stack.extend((i, False) for i in items)
            continue
        inner = [_leaf_shape(i) or shapes[id(i)] or (24, 0) for i in items]  # (24, 0): it holds itself
        size = 2 * len(items) + 2 + sum(n for n, _ in inner)
        if size > cap:
            raise OverflowError(f"a value would be over {cap} characters, items or bits")
        shapes[id(v)] = (size, 1 + max((d for _, d in inner), default=0))
    shape = _leaf_shape(x) or shapes[id(x)]
    if shape[0] > cap:
        raise OverflowError(f"a value would be over {cap} characters, items or bits")
    return shape


def _items(v) -> list | None:
    """The items of a list or dict (keys and values), of a namespace's; None for anything else."""
    if not _holds_items(v):
        return None
    v = getattr(v, "_Namespace__attrs", v)
    return [*v.keys(), *v.values()] if isinstance(v, Mapping) else list(v)


def _holds_items(v) -> bool:
    from jinja2.utils import Namespace

    return isinstance(v, (Namespace, Mapping)) or (
        isinstance(v, Collection) and not isinstance(v, (str, bytes, bytearray, range)))


def _leaf_shape(v) -> tuple[int, int] | None:
    if isinstance(v, (str, bytes, bytearray)):
        return len(v), 0
    if isinstance(v, int):
        return v.bit_length() // 3 + 2, 0
    if not _holds_items(v):
        return 24, 0  # a float, None, an undefined, a loop, a macro, a range: short text
    return None


def as_int(x) -> int:
    return x if isinstance(x, int) else 0


def binop_size(operator: str, left, right, meter: Meter) -> int:
    """The characters, items or bits `left operator right` would have; 0 where small by nature
    (floats, which overflow to an error instead)."""
    if isinstance(left, int) and isinstance(right, int):
        if operator == "**":
            return right * max(abs(left).bit_length() - 1, 0) if right > 0 else 0
        return left.bit_length() + right.bit_length() if operator == "*" else max(left.bit_length(),
                                                                                 right.bit_length()) + 1
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                return meter.measure(seq) * n
    if operator == "+" and isinstance(left, (str, bytes, list, tuple)):
        return meter.measure(left) + meter.measure(right)
    if operator == "%" and isinstance(left, (str, bytes)):
        return _printf_size(left, right if isinstance(right, (tuple, Mapping)) else (right,), meter)
    return 0


_PRINTF_FIELD = re.compile(rb"%(?:\([^)]*\))?[-#0 +]*(\d*)(?:\.(\d*))?")


def _printf_size(fmt, args, meter: Meter) -> int:
    """The most `fmt % args` can make: the format, each field's width and precision, the arguments'
    text (a float's %f up to 330 digits), and any `*` width or precision taken from the arguments."""
    raw = fmt.encode("utf-8", "surrogatepass") if isinstance(fmt, str) else bytes(fmt)
    size = len(fmt) + sum(int(w or 0) + int(p or 0) for w, p in _PRINTF_FIELD.findall(raw))
    values = list(args.values()) if isinstance(args, Mapping) else list(args)
    size += sum(meter.measure(v) + 330 for v in values)
    if b"*" in raw:
        size += sum(abs(v) for v in values if isinstance(v, int))
    return size


def _format_size(fmt: str, args, kwargs, meter: Meter) -> int:
    """The most str.format can make: as _printf_size, with the numbers in each field's spec."""
    specs = [spec or "" for _, _, spec, _ in string.Formatter().parse(fmt)]
    size = len(fmt) + sum(int(n) for spec in specs for n in re.findall(r"\d+", spec))
    values = [*args, *kwargs.values()]
    size += sum(meter.measure(v) + 330 for v in values)
    if any("{" in spec for spec in specs):  # a width taken from the arguments
        size += sum(abs(v) for v in values if isinstance(v, int))
    return size


def _replace_size(s, old, new, count=-1) -> int:
    s, old, new = (str(x) if not isinstance(x, (str, bytes)) else x for x in (s, old, new))
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * len(new)


def _join_size(items, sep) -> int:
    return current_meter().measure(items) + len(items) * len(str(sep))


def method_size(owner, name: str, args, kwargs) -> int | None:
    """The most a str, bytes or int method that can grow past its arguments would make; None for
    the rest (bounded by their arguments' size, checked after)."""
    meter = current_meter()
    arg = (list(args) + list(kwargs.values()) + [None])[0]
    if name in ("ljust", "rjust", "center", "zfill"):
        return len(owner) + as_int(arg)
    if name == "expandtabs":
        return len(owner) + owner.count("\t" if isinstance(owner, str) else b"\t") * as_int(8 if arg is None else arg)
    if name == "join" and arg is not None:
        items = list(arg)
        return _join_size(items, owner)
    if name == "replace":
        return _replace_size(owner, *args, **kwargs)
    if name == "translate" and isinstance(arg, Mapping):
        return len(owner) * max([1] + [meter.measure(v) for v in arg.values()])
    if name in ("format", "format_map") and isinstance(owner, str):
        return _format_size(owner, args, kwargs if name == "format" else (arg or {}), meter)
    if name == "to_bytes":
        return as_int(arg if arg is not None else 1)
    return None


def _tojson_size(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> int:
    size, depth = _shape(x, current_meter().limit)
    indent_len = len(indent) if isinstance(indent, str) else as_int(indent)
    seps = sum(len(str(s)) for s in separators) if isinstance(separators, (list, tuple)) else 0
    # \u escapes grow a character up to 12 fold; each item may take a line indented to its depth
    return size * (12 + seps + (depth + 1) * indent_len)


def _pprint_size(value) -> int:
    size, depth = _shape(value, current_meter().limit)
    return size * (10 + depth)  # repr's escapes, and lines indented to their depth


FILTER_SIZES = {
    "center": lambda value, width=80: len(str(value)) + as_int(width),
    "indent": lambda s, width=4, first=False, blank=False: len(str(s)) + (str(s).count("\n") + 2) * (
        len(width) if isinstance(width, str) else as_int(width)),
    "wordwrap": lambda s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True: len(str(s)) + (
        len(str(s)) + 2) * len(str(wrapstring or "\n")),
    "format": lambda value, *args, **kwargs: _printf_size(str(value), kwargs or args, current_meter()),
    "join": lambda value, d="", attribute=None: _join_size(list(value), d),
    "replace": lambda s, old, new, count=None: _replace_size(s, old, new, -1 if count is None else count),
    "tojson": _tojson_size,
    "pprint": _pprint_size,
    "batch": lambda value, linecount, fill_with=None: 2 * len(value) + 2 + (
        as_int(linecount) if fill_with is not None else 0),
    "slice": lambda value, slices, fill_with=None: 2 * len(value) + 4 * as_int(slices),
    "sum": lambda iterable, attribute=None, start=0: current_meter().measure(iterable) * (
        1 if isinstance(start, (int, float)) else len(iterable) + 1),
    "urlize": lambda value, trim_url_limit=None, nofollow=False, target=None, rel=None, extra_schemes=None: 3 * len(
        str(value)) + (len(str(value)) // 4 + 1) * (64 + len(str(target or "")) + len(str(rel or ""))),
}
