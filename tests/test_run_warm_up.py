"""`salactl run` on the GPU engine warms it up before the timed generation: untimed generations that
compile the kernels and capture the decode graphs of each regime (below and past dense_len) the
timed run will use, leaving its output as it was. On CPU the GPU engine runs in Triton's interpreter."""

import importlib.util
import os

import pytest
import torch

from conftest import gpu, micro_model
from salactl.runtime.sampling import SamplingParams

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before triton is first imported
DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="GPUEngine needs triton")


def _engine(model):
    from salactl.runtime.gpu.engine import GPUEngine

    return GPUEngine(model, DEV, max_running_requests=1, chunk_size=32, kv_tokens=256)


def test_warm_up_leaves_the_timed_generation_as_it_was():
    from salactl.run_job import _warm_up_gpu_engine

    model = micro_model().to(DEV)           # dense_len 40
    ids = [3 + i % 120 for i in range(38)]             # its decode crosses dense_len: both warm-ups run
    params = SamplingParams(max_new_tokens=4, temperature=0.8, seed=3)
    cold = _engine(model).generate(ids, params).output_token_ids
    warmed = _engine(model)
    assert _warm_up_gpu_engine(warmed, ids, params, model.config) > 0
    assert warmed.generate(ids, params).output_token_ids == cold


@gpu
def test_warm_up_of_a_run_crossing_dense_len_captures_both_decode_graphs():
    from salactl.run_job import _warm_up_gpu_engine

    model = micro_model().to("cuda")
    engine = _engine(model)
    _warm_up_gpu_engine(engine, list(range(3, 39)), SamplingParams(max_new_tokens=8), model.config)
    assert {(1, False), (1, True)} <= set(engine.runner.graphs)


def test_an_empty_prompt_is_left_to_the_timed_generation_to_refuse():
    from salactl.run_job import _warm_up_gpu_engine

    model = micro_model()
    assert _warm_up_gpu_engine(None, [], SamplingParams(max_new_tokens=50), model.config) == 0.0
