"""`salactl profile --backend engine --kv-cache-dtype fp8_e4m3` on a model without calibrated KV
scales runs its cache at scale 1.0, as --help and the reference backend say (the engine used to
refuse it after the model loaded: "needs calibrated k/v scales, but layer 0 has none"). Through
Triton's interpreter on the micro model; skipped where triton is not installed and on CUDA machines."""

import copy
import os

import pytest
import torch

from conftest import micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover the engine", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

from salactl.profiling.engine_workload import build_engine_workload  # noqa: E402
from salactl.profiling.spec import ProfileSpec  # noqa: E402
from salactl.profiling.workload import Workload  # noqa: E402
from salactl.runtime.backend_reference import ReferenceBackend  # noqa: E402
from salactl.runtime.engine import Engine  # noqa: E402


def test_uncalibrated_fp8_e4m3_profiles_at_scale_one_like_the_reference():
    model = micro_model()
    cfg = model.config
    ref_model = copy.deepcopy(model)
    for i in cfg.sparse_layers:             # "scale 1.0", spelled out for the reference engine
        ref_model.model.layers[i].self_attn.register_buffer("k_scale", torch.ones(()))
        ref_model.model.layers[i].self_attn.register_buffer("v_scale", torch.ones(()))
    ref = Engine(ref_model, "cpu", chunk_size=512, kv_cache_dtype="fp8_e4m3")
    # context 39: the cache is prefilled dense and the decode step (position 39) is sparse, so
    # the scales are read by both paths without an interpreted sparse prefill (seconds)
    spec = ProfileSpec(model="micro", phases=("decode",), batch=1, context=39, backend="engine",
                       kv_cache_dtype="fp8_e4m3")
    w = Workload(spec, model, cfg, torch.device("cpu"), torch.float32, 1, "micro", ReferenceBackend(cfg), {})
    ew = build_engine_workload(w)
    assert ew.engine.pools.kv_dtype == torch.float8_e4m3fn
    for li in range(len(cfg.sparse_layers)):
        assert torch.equal(ew.engine.pools.k_scale[li], torch.ones(cfg.num_key_value_heads))
        assert torch.equal(ew.engine.pools.v_scale[li], torch.ones(cfg.num_key_value_heads))
    gen = torch.Generator().manual_seed(spec.seed)          # the cached context, as the build drew it
    prefix = torch.randint(0, cfg.vocab_size, (spec.context,), generator=gen).tolist()
    _, segments, _ = prepared = ew.prepare("decode")
    got = ew.forward(prepared)[0]
    seq = ref.new_sequence()
    ref.prefill(seq, prefix)
    want = ref.prefill(seq, segments[0][1])[-1]
    # the interpreter rounds to fp8 a little differently from torch (test_gpu_interpret's fp8 tol)
    assert (got - want).norm() / want.norm() < 5e-2
