"""Split-K tickets (runtime/ops/split_k.py) under CUDA graphs: one zeroed buffer per device, never
allocated inside a capture, so graphs replay correctly in any order (sessions 49-50: a buffer
allocated inside one graph's capture, zeroed only by that graph, gave NaN logits to graphs
captured after it that replayed first)."""

import pytest
import torch

from conftest import gpu

pytestmark = [pytest.mark.gpu, gpu]


def test_tickets_first_needed_inside_a_capture_are_refused(monkeypatch):
    from salactl.runtime.ops import split_k

    monkeypatch.setattr(split_k, "_BUFFERS", {})
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="run the forward once eagerly before capturing"):
        with torch.cuda.graph(g):
            split_k.split_counters(dev, 8)
    assert split_k._BUFFERS == {}


def test_skinny_graphs_replayed_in_any_order_match_eager(monkeypatch):
    """Split-K skinny GEMMs at 8 and 4 rows (o_proj's shape, split 2) captured 8 first, replayed
    4 first and repeatedly, each equal to its eager result; an outgrown ticket buffer is kept."""
    from salactl.runtime.ops import split_k
    from salactl.runtime.ops.gemv import skinny

    monkeypatch.setattr(split_k, "_BUFFERS", {})
    monkeypatch.setattr(split_k, "_RETIRED", [])
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(4096, 4096, device="cuda", generator=gen).bfloat16() * 0.02
    xs = {m: torch.randn(m, 4096, device="cuda", generator=gen).bfloat16() for m in (8, 4)}
    cfg = skinny.SKINNY_CONFIGS[(4096, 4096, 16)]
    assert cfg[-1] > 1, "the test needs a split-K config"
    want = {m: skinny.skinny_linear(x, w, cfg) for m, x in xs.items()}      # eager: allocates the tickets
    buf = split_k._BUFFERS[w.device]
    graphs = {}
    for m in (8, 4):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = skinny.skinny_linear(xs[m], w, cfg)
        graphs[m] = (g, out)
    assert split_k._BUFFERS[w.device] is buf
    for m in (4, 8, 4, 4, 8):
        g, out = graphs[m]
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want[m]), m
    bigger = split_k.split_counters(w.device, buf.numel() + 1)
    assert bigger is not buf and split_k._RETIRED == [buf] and not bigger.any()
    graphs[4][0].replay()                          # still points at the kept buffer
    torch.cuda.synchronize()
    assert torch.equal(graphs[4][1], want[4])
