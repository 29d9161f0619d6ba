"""The GPU engine's compressed-key (K1) bookkeeping, on a model whose selection reads K1 (topk 4 >
init_blocks 1: unforced blocks compete). Windows of a dense prompt and of dense decode steps are
compressed only when the request's first sparse step catches them up (GPUBackend.catch_up_k1), and
a reused slot must start from none; any window missed stays zero and picks the wrong blocks from
then on. Greedy tokens hardly ever show that at these sizes, so every logit row the engine computes
is compared with the reference Engine's. Through Triton's interpreter; skipped where triton is not
installed and on CUDA machines."""

import os

import pytest
import torch

from conftest import rel_err, topk_micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover the engine", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

from salactl.runtime.engine import Engine  # noqa: E402
from salactl.runtime.gpu.engine import GPUEngine  # noqa: E402
from salactl.runtime.sampling import SamplingParams  # noqa: E402


def _record_logits(engine) -> dict:
    """(prompt, position) -> the logits row the engine computed for the token at that position of
    that request, from a forward hook on its model (prefill: each segment's last token)."""
    seen = {}

    def record(_model, args, out):
        batch = args[1]
        prompt_of = {r.slot: tuple(r.prompt) for r in engine.requests.values() if r.slot >= 0}
        rows = (zip(batch.slots.tolist(), batch.positions.tolist()) if batch.decode
                else ((s.slot, s.pos0 + s.n - 1) for s in batch.segments))
        for (slot, pos), row in zip(rows, out):
            seen[prompt_of[slot], pos] = row.clone()

    engine.model.register_forward_hook(record)
    return seen


def test_batched_and_alone_requests_give_the_reference_logits_when_selection_reads_k1():
    dense_len = topk_micro_model().config.sparse_config.dense_len
    g = torch.Generator().manual_seed(0)
    # a dense prompt whose decode crosses dense_len (windows caught up at its first sparse step);
    # a short one, in the same sparse step; a sparse prompt admitted into the short one's freed slot
    spec = [(dense_len - 2, 3), (20, 3), (dense_len + 6, 2)]
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n, _ in spec]
    params = [SamplingParams(max_new_tokens=m, ignore_eos=True) for _, m in spec]
    engine = GPUEngine(topk_micro_model(), "cpu", max_running_requests=2, chunk_size=128, kv_tokens=256)
    seen = _record_logits(engine)
    batched = engine.generate_batch(list(zip(prompts, params)))
    runs = {"batched": dict(seen)}
    seen.clear()
    alone = [engine.generate(p, prm) for p, prm in zip(prompts, params)]
    runs["alone"] = seen
    ref = Engine(topk_micro_model(), "cpu", chunk_size=128)
    for prompt, b, a in zip(prompts, batched, alone):
        assert b.output_token_ids == a.output_token_ids
        out = b.output_token_ids
        want = ref.prefill(ref.new_sequence(), prompt + out[:-1], all_logits=True)
        assert want[len(prompt) - 1:].argmax(-1).tolist() == out              # the reference's own tokens
        for run, logits in runs.items():
            rows = {pos: row for (p, pos), row in logits.items() if p == tuple(prompt)}
            assert set(range(len(prompt) - 1, len(prompt) + len(out) - 1)) <= set(rows), run
            bad = {pos: rel_err(row, want[pos]) for pos, row in rows.items() if rel_err(row, want[pos]) > 1e-4}
            assert not bad, (run, len(prompt), bad)
