"""GPUEngine through Triton's interpreter (as test_gpu_engine_host_logic.py runs it): a request whose
repetition penalty overflows a logit to +inf fails alone with the UsageError naming the penalty,
like one whose processors ban every token; the request batched with it runs on."""

import os

import pytest
import torch

from conftest import micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover the engine", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

from salactl.errors import UsageError  # noqa: E402
from salactl.runtime.gpu.engine import GPUEngine  # noqa: E402
from salactl.runtime.sampling import PenaltyOverflowError, SamplingParams  # noqa: E402


def test_a_request_whose_penalty_overflows_fails_alone():
    model = micro_model()
    with torch.no_grad():
        model.lm_head.weight.mul_(1000)       # logits in the hundreds: / 1e-38 passes float32's max
    engine = GPUEngine(model, "cpu", max_running_requests=2, chunk_size=64, kv_tokens=512)
    good = ([5, 6, 7, 8], SamplingParams(max_new_tokens=3, ignore_eos=True))
    want = engine.generate(*good).output_token_ids
    bad = ([9, 10, 11], SamplingParams(max_new_tokens=3, ignore_eos=True, repetition_penalty=1e-38))
    failed, ok = engine.generate_batch([bad, good])
    assert (ok.finish_reason, ok.output_token_ids) == ("length", want)
    assert (failed.finish_reason, failed.output_token_ids) == ("error", [])
    with pytest.raises(PenaltyOverflowError, match=r"repetition_penalty \(--repetition-penalty\) 1e-38") as err:
        engine.generate(*bad)
    assert isinstance(err.value, UsageError) and "NaN" not in str(err.value)
    assert not engine.requests
