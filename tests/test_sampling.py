import pytest
import torch

from salactl.errors import UsageError
from salactl.runtime.sampling import SamplingParams, sample


def test_top_k_one_is_greedy():
    logits = torch.randn(100, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        assert sample(logits, SamplingParams(temperature=2.0, top_k=1), g) == int(logits.argmax())


def test_top_p_keeps_only_nucleus():
    logits = torch.tensor([5.0, 4.9, -10.0, -10.0])
    g = torch.Generator().manual_seed(0)
    seen = {sample(logits, SamplingParams(temperature=1.0, top_p=0.5), g) for _ in range(50)}
    assert seen <= {0, 1} and 0 in seen


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2),
                                dict(max_new_tokens=-1)])
def test_bad_params_rejected(kw):
    with pytest.raises(UsageError):
        SamplingParams(**kw)
