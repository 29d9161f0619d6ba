"""Calibration runs a long sequence through each layer in chunks (bounded attention memory); the
layer outputs and Hessians equal those of one whole-sequence call."""

import pytest
import torch

from salactl.quant import sequential
from salactl.runtime.backend_reference import ReferenceBackend
from conftest import micro_model, rel_err


@pytest.mark.parametrize("idx", [0, 1, 2])    # sparse, lightning, sparse (dense_len 40: the sparse path runs)
def test_chunked_layer_calls_match_one_call(monkeypatch, idx):
    model = micro_model()
    cfg = model.config
    layer = model.model.layers[idx]
    inps = torch.randn(3, 70, cfg.hidden_size, generator=torch.Generator().manual_seed(idx))
    groups = sequential.layer_groups(cfg, idx)
    results = []
    for chunk in (4096, 16):
        monkeypatch.setattr(sequential, "CHUNK_TOKENS", chunk)
        runner = sequential._LayerRunner(cfg, 200, ReferenceBackend(cfg))
        out = torch.zeros_like(inps)
        runner.run(layer, idx, inps, out)
        hs = [runner.hessian(layer, idx, inps, [layer.get_submodule(g[0])]) for g in groups]
        results.append((out, hs))
    (whole, h_whole), (chunked, h_chunked) = results
    assert whole.abs().sum() > 0 and rel_err(chunked, whole) < 1e-5
    for a, b in zip(h_chunked, h_whole):
        assert a.n == b.n == 3 * 70 and rel_err(a.h, b.h) < 1e-5
