"""The batched training backend equals the reference backend (per-sequence, cached) on random inputs."""

import torch

from conftest import rel_err, tiny_config, tiny_model
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.backend_train import TrainBatch, TrainingBackend
from salactl.runtime.batch import ForwardBatch
from salactl.runtime.cache import SequenceCache


def reference_logits(model, ids):
    cfg = model.config
    seq = SequenceCache(cfg, "cpu", torch.float32)
    batch = ForwardBatch.build(cfg, [seq], [len(ids)], ReferenceBackend(cfg), "cpu")
    with torch.no_grad():
        return model(ids, batch)


def train_logits(model, ids):
    B, T = ids.shape
    batch = TrainBatch.build(model.config, B, T, TrainingBackend(model.config), "cpu")
    return model(ids.reshape(-1), batch).view(B, T, -1)


def test_train_backend_matches_reference_past_dense_len(rng):
    cfg = tiny_config()
    model = tiny_model(cfg, seed=3)
    T = 300                               # dense_len 256: the last 45 rows take the sparse path
    assert T > cfg.sparse_config.dense_len + cfg.sparse_config.block_size
    ids = torch.randint(0, cfg.vocab_size, (3, T), generator=rng)
    with torch.no_grad():
        got = train_logits(model, ids)
    for b in range(3):
        want = reference_logits(model, ids[b])
        assert rel_err(got[b], want) < 1e-5


def test_train_backend_selection_is_really_sparse(rng):
    """Rows past dense_len must attend to fewer keys than causal attention allows."""
    cfg = tiny_config()
    T = 512
    q = torch.randn(2 * T, cfg.num_attention_heads, cfg.head_dim, generator=rng)
    k = torch.randn(2 * T, cfg.num_key_value_heads, cfg.head_dim, generator=rng)
    batch = TrainBatch.build(cfg, 2, T, TrainingBackend(cfg), "cpu")
    mask = batch.backend.token_mask(q, k, batch)
    keep = cfg.sparse_config.selected_blocks * cfg.sparse_config.block_size
    assert int(mask[:, :, -1].sum(-1).max()) <= keep < T
    assert bool(mask[:, :, : cfg.sparse_config.dense_len - 1].sum(-1).eq(
        torch.arange(1, cfg.sparse_config.dense_len)).all())


def test_train_backend_dense_lengths_and_gradients(rng):
    cfg = tiny_config()
    model = tiny_model(cfg, seed=4)
    ids = torch.randint(0, cfg.vocab_size, (2, 96), generator=rng)
    with torch.no_grad():
        got = train_logits(model, ids)
    assert rel_err(got[1], reference_logits(model, ids[1])) < 1e-5
    model.requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(train_logits(model, ids)[:, :-1].reshape(-1, cfg.vocab_size),
                                             ids[:, 1:].reshape(-1))
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.model.layers[1].self_attn.q_proj.weight.grad.abs().sum() > 0
