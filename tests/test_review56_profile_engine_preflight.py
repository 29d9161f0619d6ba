"""`salactl profile --backend engine`: the memory preflight asks GPUEngine's own pool planner
(plan_pools) with the sizes build_engine_workload gives it, before loading, so a step the engine
would refuse after the weights load (its prefill reserve, state slots and mem_fraction were left
out, only per-token caches counted) is exit 11 up front, advising profile's own flags. Through
Triton's interpreter on the micro model, where GPUEngine sizes its pools from 2 GiB "free"."""

import dataclasses
import os
import re

import pytest
import torch

from conftest import micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover the engine", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

from salactl.errors import CapacityError  # noqa: E402
from salactl.profiling.engine_workload import build_engine_workload  # noqa: E402
from salactl.profiling.preflight import check_engine_memory, step_memory_bytes  # noqa: E402
from salactl.profiling.spec import ProfileSpec  # noqa: E402
from salactl.profiling.workload import Workload  # noqa: E402
from salactl.runtime.backend_reference import ReferenceBackend  # noqa: E402

INTERPRETER_FREE = 2 << 30          # what GPUEngine takes as free memory off CUDA


def test_a_step_the_engine_refuses_after_loading_is_refused_before_it_in_profile_flags():
    model = micro_model()
    cfg = model.config
    spec = ProfileSpec(model="micro", phases=("decode",), batch=1, context=2_000_000, backend="engine")
    caches, weights = step_memory_bytes(spec, cfg, 4, False, reference=False)
    avail = weights + INTERPRETER_FREE
    assert caches + weights <= avail                      # the per-token count alone let it through
    w = Workload(spec, model, cfg, torch.device("cpu"), torch.float32, 4, "micro", ReferenceBackend(cfg), {})
    with pytest.raises(CapacityError):                    # the engine itself, with the weights loaded
        build_engine_workload(w)
    with pytest.raises(CapacityError) as refused:
        check_engine_memory(spec, cfg, "cpu", 4, False, avail)
    message = str(refused.value)
    assert "\n" not in message and "kv_tokens" not in message and "mem_fraction" not in message, message
    advised = int(re.search(r"--context \(at most about ([\d,]+) tokens", message)[1].replace(",", ""))
    assert 0 < advised < spec.context
    check_engine_memory(dataclasses.replace(spec, context=advised), cfg, "cpu", 4, False, avail)   # fits
    with pytest.raises(CapacityError):
        check_engine_memory(dataclasses.replace(spec, context=advised + 1), cfg, "cpu", 4, False, avail)


def test_a_step_the_preflight_passes_builds():
    model = micro_model()
    cfg = model.config
    # context 38 < dense_len - 1: the build's prefill is dense (a sparse one costs the
    # interpreter seconds)
    spec = ProfileSpec(model="micro", phases=("decode",), batch=1, context=38, backend="engine")
    check_engine_memory(spec, cfg, "cpu", 4, False, step_memory_bytes(spec, cfg, 4, False)[1] + INTERPRETER_FREE)
    w = Workload(spec, model, cfg, torch.device("cpu"), torch.float32, 4, "micro", ReferenceBackend(cfg), {})
    assert build_engine_workload(w).engine.scheduler.pages.free == 0
