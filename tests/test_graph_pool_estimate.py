"""The CUDA-graph pool estimate for sala-9b by hand, from what the docstrings say it holds: the
largest decode bucket's per-step intermediates, each of its rows one token of prefill workspace
(residual + normed input, the wider of the MLP intermediates and the mixer's projections with
their fp32 GLA copies) plus its own fp32 logits row."""

from salactl.reports.memory import cuda_graph_pool_bytes, server_memory
from salactl.runtime.presets import sala_9b

MAX_BATCH = 32


def test_sala_9b_graph_pool_at_batch_32_by_hand():
    cfg = sala_9b()
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (4096, 16384, 73448)
    assert cfg.num_attention_heads * cfg.head_dim == 4096
    bf16 = 2
    residual_and_normed = 2 * 4096 * bf16                   # 16,384
    mlp = 3 * 16384 * bf16                                  # gate, up, product: 98,304
    mixer = 4 * 4096 * bf16 + 4 * 4096 * 4                  # q, k, v, gate + fp32 q/k/v/o: 98,304
    logits = 73448 * 4                                      # one fp32 row: 293,792
    per_row = residual_and_normed + max(mlp, mixer) + logits
    assert per_row == 408_480
    assert cuda_graph_pool_bytes(cfg, MAX_BATCH) == MAX_BATCH * per_row == 13_071_360
    assert cuda_graph_pool_bytes(cfg, 1) == per_row            # one row, one logits row
    server = server_memory(cfg, max_batch=MAX_BATCH)
    assert server.cuda_graphs == 13_071_360
    assert server.to_dict()["cuda_graphs_estimate"] == 13_071_360
    assert server_memory(cfg, max_batch=MAX_BATCH, cuda_graphs=False).cuda_graphs == 0
