"""Programmatic dependent launch switches (runtime/ops/pdl.py): off wherever the kernels cannot use
it, on for sm_90+ GPUs unless SALACTL_PDL=0; and a CUDA graph of PDL-launched kernels that read each
other's outputs gives the eager result."""

import importlib.util

import pytest
import torch

from conftest import gpu

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


@needs_triton
def test_pdl_is_off_on_cpu_and_with_the_env_switch(monkeypatch):
    from salactl.runtime.ops import pdl

    assert pdl.launch_args(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}
    monkeypatch.setenv("SALACTL_PDL", "0")
    assert not pdl.enabled(torch.device("cuda", 0))
    monkeypatch.setenv("SALACTL_PDL", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled(torch.device("cuda", 0))


@gpu
@needs_triton
def test_chained_pdl_kernels_in_a_cuda_graph_match_eager():
    """silu_mul -> add_rmsnorm -> sigmoid_gate, each reading the previous output, 50 times in one
    graph: a kernel that started reading before its predecessor finished would change the result."""
    from salactl.runtime.ops.fused import triton as fused

    gen = torch.Generator(device="cuda").manual_seed(0)
    gu = torch.randn(8, 2 * 4096, device="cuda", generator=gen).bfloat16()
    w = torch.rand(4096, device="cuda", generator=gen).bfloat16()

    def chain():
        h = fused.silu_mul(gu)
        for _ in range(50):
            h, y = fused.add_rmsnorm(h, fused.sigmoid_gate(h, h), 0.5, w, 1e-6)
            h = fused.sigmoid_gate(y, h)
        return h

    want = chain()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = chain()
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
