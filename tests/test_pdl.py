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
    """The switches without a GPU: torch's capability query answers for made-up devices 98 (sm_90)
    and 99 (sm_80). TRITON_INTERPRET is removed first: three interpreter test modules set it at
    import, and it turns PDL off by itself, which would hide a broken SALACTL_PDL switch."""
    from salactl.runtime.ops import pdl

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("SALACTL_PDL", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=None: {98: (9, 0), 99: (8, 0)}[idx])
    monkeypatch.setattr(pdl, "_CAPABLE", {})      # a cache per device index: keep the made-up ones out of it
    hopper, ampere = torch.device("cuda", 98), torch.device("cuda", 99)
    assert pdl.launch_args(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}
    assert pdl.enabled(hopper) and pdl.launch_args(hopper) == {"PDL": True, "launch_pdl": True}
    assert not pdl.enabled(ampere)
    monkeypatch.setenv("SALACTL_PDL", "0")
    assert not pdl.enabled(hopper) and pdl.launch_args(hopper) == {"PDL": False, "launch_pdl": False}
    monkeypatch.setenv("SALACTL_PDL", "1")
    assert pdl.enabled(hopper)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled(hopper)


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
