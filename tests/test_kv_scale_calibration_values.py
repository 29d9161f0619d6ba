"""`quantize --kv-cache-dtype fp8_e4m3` stores the scales reference/quantization.md §4 asks for:
amax(|K|) / 448 and amax(|V|) / 448 over every calibration token (per layer, or per KV head with
--kv-scales-per-head), with K and V recomputed here by running the same calibration tokens through
the quantized model (the calibration pass sees each layer's K/V after the layers up to it are
quantized) and reducing them by hand. The SGLang --quantization-param-path file carries the same
values: one per layer, max(k, v), 1.0 where there is no KV cache."""

import json

import pytest
import torch

from salactl.quant.api import quantize_checkpoint
from salactl.quant.sequential import QuantOptions
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.engine import Engine
from salactl.runtime.loader import load_model
from test_quantize_cli import _tensors

E4M3_MAX = 448.0
NSAMPLES, SEQLEN, SEED = 3, 64, 0
# --batch-tokens 64: one calibration sequence per forward call, so three batches
CALL = dict(calib="random", nsamples=NSAMPLES, seqlen=SEQLEN, seed=SEED, device="cpu",
            dtype="float32")


class _Recorder(ReferenceBackend):
    """The reference backend, keeping every K and V its softmax attention layers get."""

    def __init__(self, config):
        super().__init__(config)
        self.seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def softmax_attention(self, layer, q, k, v, batch):
        kv = (k.detach().float().clone(), v.detach().float().clone())
        self.seen.setdefault(layer, []).append(kv)
        return super().softmax_attention(layer, q, k, v, batch)


def _calibration_kv(model, config) -> dict[int, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per softmax attention layer, per calibration sample: K and V [tokens, Hkv, d]."""
    gen = torch.Generator().manual_seed(SEED)                  # calib "random": seeded token ids
    ids = torch.randint(0, config.vocab_size, (NSAMPLES, SEQLEN), generator=gen)
    rec = _Recorder(config)
    eng = Engine(model, "cpu", chunk_size=SEQLEN, backend=rec)
    for row in ids:
        eng.prefill(eng.new_sequence(), row.tolist())
    return rec.seen


@pytest.fixture(scope="module", params=[False, True], ids=["per_layer", "per_head"])
def calibrated(request, tmp_path_factory):
    """(model quantized in place, its written checkpoint, per_head, K/V per layer and sample)."""
    per_head = request.param
    lm = load_model("sala-nano", "cpu", "float32")
    out = tmp_path_factory.mktemp("kv") / "q"
    opts = QuantOptions(method="rtn", kv_cache_dtype="fp8_e4m3", kv_scales_per_head=per_head,
                        batch_tokens=SEQLEN)
    record = quantize_checkpoint(lm, out, opts, **CALL)
    assert record["calibration"]["samples"] == NSAMPLES
    assert record["calibration"]["tokens"] == NSAMPLES * SEQLEN
    return lm, out, per_head, _calibration_kv(lm.model, lm.config)


def _amax(x: torch.Tensor, per_head: bool) -> torch.Tensor:
    """max |x| over tokens and head_dim, per KV head [Hkv]; or over everything, a scalar."""
    a = x.abs().amax(dim=2).amax(dim=0)
    return a if per_head else a.max()


def test_stored_kv_scales_are_the_calibration_amax_over_448(calibrated):
    lm, out, per_head, kv = calibrated
    cfg = lm.config
    assert sorted(kv) == list(cfg.sparse_layers) == [0, 7]
    assert all(len(samples) == NSAMPLES for samples in kv.values())
    tensors = _tensors(out)
    hkv = cfg.num_key_value_heads
    negative_peak = peak_before_last = False
    for i, samples in kv.items():
        for which, idx in (("k", 0), ("v", 1)):
            xs = [s[idx] for s in samples]
            every = torch.cat(xs)                                       # [tokens, Hkv, d]
            peak = _amax(every, per_head)
            got = tensors[f"model.layers.{i}.self_attn.{which}_scale"]
            assert got.dtype == torch.float32
            assert got.shape == ((hkv,) if per_head else ()), (i, which, got.shape)
            torch.testing.assert_close(got, peak / E4M3_MAX, rtol=1e-5, atol=0,
                                       msg=f"layer {i} {which}_scale")
            # what makes this check bite: a largest |x| that is a negative value, and one that
            # comes from a calibration batch before the last
            signed = every.amax(dim=2).amax(dim=0)
            signed = signed if per_head else signed.max()
            negative_peak |= bool((peak > signed * 1.01).any())
            peak_before_last |= bool((peak > _amax(xs[-1], per_head) * 1.01).any())
    assert negative_peak, "no K/V amax is a negative value: a missing abs() would go unseen"
    assert peak_before_last, "every K/V amax is in the last batch: a dropped batch would go unseen"


def test_sglang_param_file_carries_the_same_scales(calibrated):
    lm, out, per_head, kv = calibrated
    cfg = lm.config
    sg = json.loads((out / "kv_cache_scales.json").read_text())
    assert sg["kv_cache"]["dtype"] == "float8_e4m3fn"
    per_layer = sg["kv_cache"]["scaling_factor"]["0"]
    assert set(per_layer) == {str(i) for i in range(cfg.num_hidden_layers)}
    peak_before_last = False
    for i in range(cfg.num_hidden_layers):
        if i not in kv:
            assert per_layer[str(i)] == 1.0          # lightning layers: no KV cache
            continue
        # SGLang's file is per tensor and shared by K and V: the larger amax of the two
        amax = max(float(x.abs().max()) for sample in kv[i] for x in sample)
        assert per_layer[str(i)] == pytest.approx(amax / E4M3_MAX, rel=1e-5), i
        peak_before_last |= amax > 1.01 * max(float(x.abs().max()) for x in kv[i][-1])
    assert peak_before_last, "every amax is in the last batch: a dropped batch would go unseen"
