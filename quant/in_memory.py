"""Weight-only quantization of a model already in memory, no checkpoint written: --weights /
--weight-dtype w4a16 / w8a16 for a bf16 model (random weights or a bf16 checkpoint) is round-to-nearest
symmetric 4-bit (or 8-bit), group 128, into the same GPTQLinear a GPTQ checkpoint loads into, so the
model reads exactly the packed bytes of a real one. Also: which of these a loaded model already is."""

from __future__ import annotations


# the quantized weight names of the CLI (--weights, --weight-dtype) and their bits
QUANTIZED_BITS = {"w4a16": 4, "w8a16": 8}


def quantized_as(model) -> str | None:
    """"w4a16" / "w8a16" for a GPTQ checkpoint's model (its linears' bits), None for a float one."""
    bits = {m.bits for m in model.modules() if hasattr(m, "qweight")}
    return f"w{max(bits)}a16" if bits else None


def quantize_rtn_in_memory(model, config, group_size: int = 128, bits: int = 4):
    from salactl.quant.linear import GPTQLinear
    from salactl.quant.packing import to_gptq_tensors
    from salactl.quant.quantizer import QuantSpec
    from salactl.quant.rtn import rtn_quantize
    from salactl.quant.sequential import layer_groups, plan_skips

    # scales exact in bf16 too, as `salactl quantize` writes them for a checkpoint served in bf16
    # (sequential.solver_spec): the CPU layouts hold them in bf16
    spec = QuantSpec(bits, group_size, bf16_exact_scales=config.torch_dtype != "float16")
    skipped = plan_skips(model, config, group_size)
    device = model.device
    dtype = model.model.embed_tokens.weight.dtype
    for i, layer in enumerate(model.model.layers):
        for group in layer_groups(config, i):
            for name in group:
                if f"model.layers.{i}.{name}" in skipped:
                    continue
                lin = layer.get_submodule(name)
                q = rtn_quantize(lin.weight, spec)
                t = to_gptq_tensors(q.codes, q.scales, q.g_idx, bits)
                new = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], bits, group_size, device,
                                            dtype, f"model.layers.{i}.{name}")
                parent, _, attr = name.rpartition(".")
                setattr(layer.get_submodule(parent) if parent else layer, attr, new)
                del q, t, lin
    return model
