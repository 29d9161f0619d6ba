"""Launch grids off CUDA (Triton's CPU interpreter, which runs a grid's programs one after another):
sized for a few SMs, not an H200's 132, so a one-request decode step's selection runs 16 lse splits
instead of 256, while the interpreter tests' batches still run more than one split (and stay exact:
the interpreter tests of select_decode and the GPU engine compare them with the reference)."""

import os

import pytest
import torch

from salactl.runtime.ops.device_props import sm_count

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before triton is first imported (the interpreter tests')


def test_off_cuda_the_sm_count_is_the_interpreters_few():
    assert sm_count(torch.device("cpu")) == 8


def test_the_default_selection_splits_off_cuda_stay_few_but_several():
    pytest.importorskip("triton")
    from salactl.runtime.ops.selection.gpu import default_lse_splits

    cpu = sm_count(torch.device("cpu"))
    # rows = requests x KV heads (2 in the micro and nano models); decode fuses the K1 update, whose
    # split only compresses: 12 rows (test_gpu_interpret's decode selection) keep 3 scoring splits
    assert [default_lse_splits(rows, cpu, fuse=True) for rows in (2, 6, 12)] == [16, 7, 4]
    assert default_lse_splits(16, cpu, fuse=False) == 2          # check_selection's 8 queries x 2 heads
    assert [default_lse_splits(rows, 132, fuse=True) for rows in (2, 6, 12)] == [256, 89, 45]   # an H200's
