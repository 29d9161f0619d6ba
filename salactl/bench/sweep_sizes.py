"""The sweep's sizes against host memory, before the model loads: prompts, the KL's logits and (on
CPU) one point's caches that cannot fit are a CapacityError (exit 11), not a MemoryError or a
machine run out of memory."""

from __future__ import annotations

from salactl.bench.grid_memory import cache_bytes_per_request
from salactl.bench.synthetic import check_host_memory, prompt_set_bytes
from salactl.errors import SalactlError
from salactl.lists import parse_list

# float64 [tokens, vocab] logits alive at once in the KL: the dense reference, the point's, and
# logit_kl's log-softmaxes, probabilities and products (plus the engine's own copy)
KL_LOGIT_COPIES = 8


def check_sizes_fit(s, device) -> None:
    """`s`: SweepSettings whose values are checked already; `device`: the resolved torch.device."""
    from salactl.runtime.loader import DTYPES, planning_config, resolve_dtype

    check_host_memory(prompt_set_bytes(s.requests, s.requests * s.input_len),
                      f"--requests {s.requests:,} prompts of --input-len {s.input_len:,} tokens",
                      "lower --requests or --input-len")
    try:
        config = planning_config(s.model)
    except SalactlError:
        return                          # loading the model says why, after the sweep's own checks
    kl_tokens = (s.kl_len or s.input_len) if s.kl else 0
    if kl_tokens:
        check_host_memory(KL_LOGIT_COPIES * 8 * kl_tokens * config.vocab_size,
                          f"the logit KL over {kl_tokens:,} tokens x {config.vocab_size:,} vocabulary",
                          "lower --kl-len (default: --input-len), or pass --no-kl")
    if device.type != "cpu":
        return                          # GPU caches: the GPU engine's --mem-fraction budget decides
    # the widest activation dtype a point runs in: --dtype's, or a --weight-dtype cast to fp32/fp16/bf16
    casts = [DTYPES[w].itemsize for w in parse_list(s.weight_dtype, "--weight-dtype", str)
             if w in DTYPES] if s.weight_dtype else []
    item = max([resolve_dtype(s.dtype, device).itemsize, *casts])
    lengths = parse_list(s.passkey_lengths, "--passkey-lengths", int) if s.passkey else []
    batch = max(parse_list(s.batch_size, "--batch-size", int)) if s.batch_size else 1
    longest = max([s.input_len + s.output_len, kl_tokens, *lengths])
    check_host_memory(batch * cache_bytes_per_request(config, longest, item, item),
                      f"the KV cache and states of {batch} request(s) of {longest:,} tokens",
                      "lower --input-len/--output-len (or --kl-len, --passkey-lengths, --batch-size)")
