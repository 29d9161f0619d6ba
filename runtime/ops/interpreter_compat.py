"""Triton's CPU interpreter (TRITON_INTERPRET=1: the kernel tests on CPU) before Triton 3.7.

Those interpreters turn a scalar tensor into a Python int (a loop bound such as
`range(start * NSUB, end * NSUB)`) with `int(handle.data)`, and their scalars are often one-element
arrays. NumPy 2.4 refuses int() of an array with ndim > 0 ("only 0-dimensional arrays can be
converted to Python scalars"), so with torch 2.11 (which pins Triton 3.6) and a current NumPy every
kernel with a runtime loop bound failed in the interpreter. Triton 3.7 squeezes the array first;
`squeeze_interpreter_indices` gives older interpreters the same squeeze. Compiled kernels (any GPU)
never take this path, and Triton >= 3.7 is left as it is.
"""

from __future__ import annotations

import functools
import re

import triton

FIXED_IN = (3, 7)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def squeeze_interpreter_indices() -> bool:
    """Patch this Triton's interpreter if it predates the fix; True when it was patched (once)."""
    if _version(triton.__version__) >= FIXED_IN:
        return False
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "squeezes_indices", False):
        return False

    @functools.wraps(original)
    def patch_lang_tensor(tensor, *scope):
        original(tensor, *scope)
        index = lambda self: int(self.handle.data.squeeze())    # noqa: E731 - as the interpreter's own
        if scope:               # 3.6: a scope that restores the attributes after the launch
            scope[0].set_attr(tensor, "__index__", index)
        else:
            tensor.__index__ = index

    patch_lang_tensor.squeezes_indices = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True
