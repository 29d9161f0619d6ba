"""runtime/ops/interpreter_compat.py: the loop-bound squeeze given to Triton interpreters before 3.7
(torch 2.11 pins Triton 3.6, whose interpreter fails under NumPy 2.4). Here it is forced onto the
installed interpreter, and a kernel whose loop bounds are loaded from memory must still compute the
right sums, leave nothing patched after its launch, and be patched once only. Skipped without
triton and on CUDA machines (compiled kernels never use the interpreter)."""

import os

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("CUDA present: compiled kernels never take the interpreter's path",
                allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from salactl.runtime.ops import interpreter_compat, pdl  # noqa: E402,F401 - pdl applies the shim


@triton.jit
def _ranged_sums(bounds_ptr, x_ptr, out_ptr):
    row = tl.program_id(0)
    start = tl.load(bounds_ptr + 2 * row)
    end = tl.load(bounds_ptr + 2 * row + 1)
    acc = tl.zeros([1], tl.float32)
    if end > start:                         # a scalar branch: the interpreter's own __bool__
        for i in range(start, end):         # runtime bounds: the interpreter calls __index__ on them
            acc += tl.load(x_ptr + i + tl.arange(0, 1))
    else:
        acc -= 0.5
    tl.store(out_ptr + row + tl.arange(0, 1), acc)


@pytest.fixture
def forced(monkeypatch):
    """The shim applied to this interpreter whatever its version (to its unpatched function, where
    importing the kernels patched it already); what was there restored after."""
    current = interpreter._patch_lang_tensor
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", getattr(current, "__wrapped__", current))
    monkeypatch.setattr(interpreter_compat, "FIXED_IN", (10 ** 6, 0))
    return interpreter_compat.squeeze_interpreter_indices()


def test_a_kernel_with_loaded_loop_bounds_runs_right_under_the_squeeze(forced):
    assert forced is True
    assert interpreter_compat.squeeze_interpreter_indices() is False     # once only
    x = torch.arange(1.0, 21.0)
    bounds = torch.tensor([0, 5, 3, 3, 7, 20], dtype=torch.int32)
    out = torch.full((3,), -1.0)
    _ranged_sums[(3,)](bounds, x, out)
    assert out.tolist() == [x[0:5].sum().item(), -0.5, x[7:20].sum().item()]
    assert not hasattr(tl.tensor, "__index__")      # the launch's scope restored the class


def test_an_interpreter_that_has_the_fix_is_left_alone():
    before = interpreter._patch_lang_tensor
    if interpreter_compat._version(triton.__version__) >= interpreter_compat.FIXED_IN:
        assert interpreter_compat.squeeze_interpreter_indices() is False
        assert interpreter._patch_lang_tensor is before
    else:                                   # imported through the kernels: patched already
        assert getattr(before, "squeezes_indices", False)
