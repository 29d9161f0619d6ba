import pytest
import torch

from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.loader import build_model
from salactl.runtime.presets import sala_nano


def tiny_config(**sparse_overrides):
    cfg = sala_nano(vocab_size=512)
    if sparse_overrides:
        import dataclasses
        cfg = cfg.replace(sparse_config=dataclasses.replace(cfg.sparse_config, **sparse_overrides))
    return cfg


def tiny_model(cfg=None, seed=0, dtype=torch.float32) -> SalaForCausalLM:
    cfg = cfg or tiny_config()
    return build_model(cfg, random_state_dict(cfg, "cpu", dtype, seed))


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
