"""Both engines on a second GPU: their kernels (Triton launches on the thread's current CUDA device)
must run there from any thread, not on cuda:0. Needs two GPUs; skips otherwise."""

import threading

import pytest
import torch

from conftest import tiny_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


def _tokens(engine_name, device, prompt, from_thread=False):
    from salactl.runtime.engine import Engine
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.sampling import SamplingParams

    model = tiny_model(seed=5, dtype=torch.bfloat16).to(device)
    kw = dict(max_running_requests=2, chunk_size=128, kv_tokens=4096) if engine_name == "gpu" else {}
    engine = (GPUEngine if engine_name == "gpu" else Engine)(model, device, **kw)
    out = []
    run = lambda: out.append(engine.generate(prompt, SamplingParams(max_new_tokens=8)).token_ids)  # noqa: E731
    if from_thread:
        t = threading.Thread(target=run)
        t.start()
        t.join()
    else:
        run()
    assert out, "generation raised in its thread"
    return out[0]


@pytest.mark.parametrize("engine_name", ["gpu", "reference"])
@pytest.mark.parametrize("from_thread", [False, True])
def test_engine_on_cuda1_matches_cuda0(engine_name, from_thread):
    prompt = list(range(3, 300))
    want = _tokens(engine_name, "cuda:0", prompt)
    assert _tokens(engine_name, "cuda:1", prompt, from_thread) == want
    assert torch.cuda.current_device() == 0


def test_measured_ceilings_on_cuda1_time_cuda1(tmp_path, monkeypatch):
    """CUDA events record on the current device's stream: timed from cuda:0 they would measure
    nothing of cuda:1's work (two identical GPUs measure alike)."""
    from salactl.runtime.peaks_measure import measure
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    on0, on1 = measure(torch.device("cuda:0")), measure(torch.device("cuda:1"))
    assert 0.5 < on1.mem_gbps / on0.mem_gbps < 2
    assert torch.cuda.current_device() == 0
