"""`salactl profile --backend engine`: the engine's KV pool holds every row's whole pages, also when
the room a row needs is not a multiple of the page size (it used to be sized in tokens, so the
last row's pages did not fit: "out of KV cache pages"). Through Triton's interpreter on
topk_micro_model (16-token pages; dense_len 136, so every step here is dense: the pages hold
the same K/V, and sparse steps would only cost interpreter time); skipped where triton is not
installed and on CUDA machines."""

import copy
import os

import pytest
import torch

from conftest import topk_micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover the engine", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

from salactl.profiling.engine_workload import build_engine_workload  # noqa: E402
from salactl.profiling.spec import ProfileSpec  # noqa: E402
from salactl.profiling.workload import Workload  # noqa: E402
from salactl.runtime.backend_reference import ReferenceBackend  # noqa: E402
from salactl.runtime.engine import Engine  # noqa: E402


@pytest.mark.parametrize("context, phases, batch", [
    (48, ("decode",), 1),                # a row's room (48 + 16 + 16 tokens) is whole pages
    (50, ("prefill", "decode"), 2),      # 82 tokens: 6 pages a row, 24 for 4 rows (21 counted in tokens)
    (53, ("prefill",), 2),               # 85 tokens: 6 pages a row, 12 for 2 rows (11 in tokens)
])
def test_every_row_of_every_phase_gets_its_pages_and_the_reference_logits(context, phases, batch):
    model = topk_micro_model()
    cfg = model.config
    ref = Engine(copy.deepcopy(model), "cpu", chunk_size=24)
    spec = ProfileSpec(model="micro", phases=phases, batch=batch, context=context, chunk_size=16, backend="engine")
    w = Workload(spec, model, cfg, torch.device("cpu"), torch.float32, 4, "micro", ReferenceBackend(cfg), {})
    ew = build_engine_workload(w)
    assert ew.engine.scheduler.pages.free == 0            # sized to the rows' pages, none to spare
    gen = torch.Generator().manual_seed(spec.seed)         # the cached contexts, as the build drew them
    prefixes = {ph: [torch.randint(0, cfg.vocab_size, (spec.step_rows(ph)[1],), generator=gen).tolist()
                     for _ in range(batch)] for ph in phases}
    for phase in phases:
        _, segments, _ = prepared = ew.prepare(phase)
        got = ew.forward(prepared)
        for row, (prefix, (_, toks, _)) in enumerate(zip(prefixes[phase], segments)):
            seq = ref.new_sequence()
            ref.prefill(seq, prefix)
            want = ref.prefill(seq, toks)[-1]
            assert (got[row] - want).norm() / want.norm() < 1e-4, (phase, row)
