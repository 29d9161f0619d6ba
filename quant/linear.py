"""`GPTQLinear`: a weight-only quantized drop-in for nn.Linear (symmetric GPTQ, 4- or 8-bit).

The packed weights are *buffers* in the layout of the device's fast path, so the roofline
(which sums a module's parameters + buffers) counts exactly the bytes a forward reads:
- "triton"   (CUDA, 4-bit, K % 128 == 0): int32 [K/128, N'/16, 256] in the MMA register order
              (runtime/ops/w4a16/layout.py `pack_tc`) + fp16 scales [groups, N'], N padded to N', a
              multiple of 16, with zero rows the output drops (a 73448-token lm_head);
              our Triton kernels (runtime/ops/w4a16/triton.py `w4a16_linear`), on bf16 activations
              in a float32 model (the kernels take 16-bit activations, as on CPU below).
- "cpu_int4" (CPU, 4-bit, groups 32/64/128/256 or per-channel with K % 128 == 0): torch's
              `_weight_int4pack_mm_for_cpu` (uint8 [N', K/2] + bf16 scales and zeros [groups, N', 2], N
              padded to N', a multiple of 16, with zero rows the output drops)
              on bf16 activations, whatever the model's dtype: fp32 and fp16 activations are
              rounded to bf16 for the product (W4A16: 16-bit activations), because torch only
              vectorizes the bf16 kernel (2-core AVX-512 CPU, 768x2048 at one row: bf16 0.04 ms, fp32
              1.37, fp16 2.2, against a dense fp32 matmul's 0.12).
- "triton8"  (CUDA, 8-bit, K % 64 == 0, N % 16 == 0, groups of 64k rows or per-channel): int32
              [K/64, N/16, 256] in the MMA register order (runtime/ops/w8a16/layout.py `pack_tc8`)
              + fp16 scales [groups, N]; up to 64 rows our tensor-core kernel
              (runtime/ops/w8a16/triton_tc.py), above it the weight dequantized by our kernel and
              cuBLAS; bf16 activations in a float32 model.
- "int8"     (CPU, or CUDA where triton8 does not fit, 8-bit): int8 [groups, N, group] codes − 128
              + scales [groups, N]. On
              CPU (bf16 scales) on bf16 activations: up to CPU_INT8_GEMV_ROWS rows one
              `_weight_int8pack_mm` per group (its per-channel scale is the group's), summed in
              fp32; above, the weight dequantized to bf16 once per call and one bf16 matmul, because
              that op is not blocked for many rows (768x2048, group 128: 1 row 0.12 ms against fp32
              dense 0.11 and the per-call fp32 dequantization 2.5; 512 rows 24 ms against 1.3
              dequantized). On CUDA (fp16 scales) up to 64 rows our Triton W8A16 kernel
              (runtime/ops/w8a16/triton.py, 16-bit activations; groups of 16k rows), above it (or
              for other groups) the weight dequantized to the activations' dtype and cuBLAS.
- "dequant"  (everything else): GPTQ v1 tensors, dequantized on every call by the plain reference.
Act-order checkpoints (g_idx not k // group) are repacked in sorted-group order at load time and
carry a `perm` buffer that gathers the activations.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from salactl.errors import CheckpointError
from salactl.quant.packing import default_g_idx, pack_qweight, unpack_qweight
from salactl.runtime.ops.w4a16 import reference
from salactl.runtime.ops.w8a16.layout import pack_tc8, tc8_fits, unpack_tc8

_CPU_INT4_GROUPS = (32, 64, 128, 256)
_MODEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CPU_INT8_GEMV_ROWS = 8


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _cpu_int4_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


def _sixteen_bit(x: torch.Tensor) -> torch.Tensor:
    """Activations for the Triton kernels, which take 16-bit ones: bf16 when the model is float32."""
    return x.to(torch.bfloat16) if x.dtype == torch.float32 else x


def gptq_scales_fp16(scales: torch.Tensor, name: str = "linear") -> torch.Tensor:
    """GPTQ scales in float16, the dtype every layout computes from (bf16/fp32 files are cast);
    finiteness is checked after the cast, so values beyond fp16's range (65504) are refused."""
    s16 = scales.to(torch.float16)
    if not bool(torch.isfinite(s16).all()):
        bad = scales[~torch.isfinite(s16)].float()
        if not bool(torch.isfinite(bad).all()):
            raise CheckpointError(f"{name}.scales has NaN/Inf")
        raise CheckpointError(f"{name}.scales has {bad.abs().max().item():.4g}, outside float16's range "
                              f"(max {torch.finfo(torch.float16).max:g}), the dtype GPTQ scales run in")
    return s16


def _cpu_int8_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


def choose_layout(device: torch.device, bits: int, in_features: int, group_size: int, dtype: torch.dtype,
                  out_features: int = 16, *, triton_ok: bool) -> str:
    """The weight layout for this device and shape; triton_ok: Triton is importable."""
    if bits == 8 and device.type == "cuda" and dtype in _MODEL_DTYPES and triton_ok \
            and tc8_fits(in_features, out_features, group_size):
        return "triton8"
    if bits == 8 and (group_size == -1 or in_features % group_size == 0) and dtype in _MODEL_DTYPES \
            and (device.type == "cuda" or (device.type == "cpu" and _cpu_int8_available())):
        return "int8"
    if bits != 4:
        return "dequant"
    if device.type == "cuda" and in_features % 128 == 0 and dtype in _MODEL_DTYPES \
            and (group_size == -1 or group_size % 128 == 0 or group_size in (16, 32, 64)) and triton_ok:
        return "triton"
    if device.type == "cpu" and dtype in _MODEL_DTYPES and _cpu_int4_available():
        if group_size in _CPU_INT4_GROUPS or (group_size == -1 and in_features % 128 == 0):
            return "cpu_int4"
    return "dequant"


class GPTQLinear(nn.Module):
    """A symmetric GPTQ linear (4-bit: W4A16, 8-bit: W8A16) in the layout `choose_layout` picked for
    its device; from_gptq builds it from a checkpoint's tensors."""

    def __init__(self, in_features: int, out_features: int, bits: int, group_size: int, layout: str,
                 buffers: dict[str, torch.Tensor]):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group_size, self.layout = bits, group_size, layout
        self.register_buffer("perm", None)       # act-order input permutation, if any
        for name, t in buffers.items():
            self.register_buffer(name, t)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, layout={self.layout}")

    @classmethod
    def from_gptq(cls, qweight: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None, bits: int,
                  group_size: int, device, dtype: torch.dtype, name: str = "linear") -> "GPTQLinear":
        """Build from symmetric GPTQ tensors (qweight [K·bits/32, N], scales [groups, N], g_idx [K])."""
        device = torch.device(device)
        K, N = qweight.shape[0] * 32 // bits, qweight.shape[1]
        g = K if group_size == -1 else group_size
        natural = default_g_idx(K, group_size)
        perm = None
        if g_idx is not None and not torch.equal(g_idx.cpu().to(torch.int32), natural):
            perm = torch.argsort(g_idx.cpu().long(), stable=True)
            if not torch.equal(g_idx.cpu().long()[perm], natural.long()):
                raise CheckpointError(f"{name}.g_idx does not assign exactly {g} input channels to each "
                                      "group; this act-order layout is not supported")
            codes = unpack_qweight(qweight.cpu(), bits)[perm]
            qweight = pack_qweight(codes, bits)
        layout = choose_layout(device, bits, K, group_size, dtype, N, triton_ok=device.type == "cuda" and _triton_available())
        scales16 = gptq_scales_fp16(scales, name)
        if layout == "triton":
            from salactl.runtime.ops.w4a16.layout import pack_tc

            # the layout tiles 16 output rows: pad N with zero rows (code 8, scale 0), outputs cut off
            pad = -N % 16
            codes = torch.nn.functional.pad(unpack_qweight(qweight.to(device), 4), (0, pad), value=8)
            buffers = {"qweight": pack_tc(codes), "scales": torch.nn.functional.pad(scales16.to(device), (0, pad))}
        elif layout == "cpu_int4":
            # the op packs whole tiles of 16 output rows: pad N with zero rows (code 8, scale 0), outputs cut off
            pad = -N % 16
            codes_nk = unpack_qweight(qweight.cpu(), 4).t()
            codes_nk = torch.nn.functional.pad(codes_nk, (0, 0, 0, pad), value=8).contiguous()
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes_nk, 1)
            s = torch.nn.functional.pad(scales16.float(), (0, pad))
            gq = g
            if group_size == -1:          # per-channel: the same scale for every 128-row group
                gq = 128
                s = s.expand(K // 128, N + pad)
            sz = torch.stack([s, torch.zeros_like(s)], dim=-1).to(torch.bfloat16).contiguous()
            buffers = {"qweight": packed, "scales_and_zeros": sz}
            group_size_kernel = gq
        elif layout == "triton8":
            buffers = {"qweight": pack_tc8(unpack_qweight(qweight.to(device), 8)), "scales": scales16.to(device)}
        elif layout == "int8":
            codes = unpack_qweight(qweight.cpu(), 8) - 128                  # [K, N], symmetric zero 128
            codes = codes.to(torch.int8).t().reshape(N, K // g, g).transpose(0, 1).contiguous()
            buffers = {"qweight": codes.to(device),
                       "scales": (scales16.to(torch.bfloat16) if device.type == "cpu" else scales16).to(device)}
        else:
            buffers = {"qweight": qweight.to(device), "scales": scales16.to(device),
                       "g_idx": natural.to(device)}
        mod = cls(K, N, bits, group_size, layout, buffers)
        if layout == "cpu_int4":
            mod.kernel_group = group_size_kernel
        if perm is not None:
            mod.perm = perm.to(device=device, dtype=torch.int64)
        return mod

    def dequantized_weight(self) -> torch.Tensor:
        """fp32 [N, K] in the module's (possibly act-order-permuted) input order."""
        if self.layout in ("triton", "triton8"):
            from salactl.runtime.ops.w4a16.layout import unpack_tc

            codes = (unpack_tc(self.qweight) if self.layout == "triton" else unpack_tc8(self.qweight)).float()
            g = default_g_idx(self.in_features, self.group_size, codes.device).long()
            return ((codes - 2 ** (self.bits - 1)) * self.scales.float()[g]).t()[:self.out_features]
        if self.layout == "cpu_int4":
            eye = torch.eye(self.in_features, dtype=torch.bfloat16)
            w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.qweight, self.kernel_group,
                                                              self.scales_and_zeros)
            return w_t[:, :self.out_features].float().t()
        if self.layout == "int8":
            return self._int8_weight(torch.float32)
        return reference.dequantize(self.qweight, self.scales, self.g_idx, self.bits)

    def _int8_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The int8 layout's weight [N, K] in `dtype` (each code times its scale, rounded once)."""
        w = self.qweight.to(dtype) * self.scales.to(dtype)[:, :, None]          # [groups, N, group]
        return w.transpose(0, 1).reshape(self.out_features, self.in_features)

    def _triton8_forward(self, x2: torch.Tensor) -> torch.Tensor:
        from salactl.runtime.ops.device_props import sm_count
        from salactl.runtime.ops.w8a16.triton_tc import MAX_ROWS, w8a16_tc, w8a16_tc_dequantize

        x16 = _sixteen_bit(x2)
        # .contiguous(): no copy, except for the views the GPU engine's fused projections leave
        qweight, scales = self.qweight.contiguous(), self.scales.contiguous()
        if x16.shape[0] <= MAX_ROWS:
            return w8a16_tc(x16, qweight, scales, self.group_size, sms=sm_count(x16.device))
        return x16 @ w8a16_tc_dequantize(qweight, scales, self.group_size, x16.dtype).t()

    def _int8_forward(self, x2: torch.Tensor) -> torch.Tensor:
        if x2.device.type == "cpu":
            return self._int8_forward_cpu(x2)
        if _triton_available():
            from salactl.runtime.ops.device_props import sm_count
            from salactl.runtime.ops.w8a16.triton import MAX_ROWS, group_fits, w8a16_linear

            if x2.shape[0] <= MAX_ROWS and group_fits(self.qweight.shape[2]):
                # .contiguous(): no copy, except for the views the GPU engine's fused projections leave
                return w8a16_linear(_sixteen_bit(x2).contiguous(), self.qweight.contiguous(), self.scales,
                                    sm_count(x2.device))
        return x2 @ self._int8_weight(x2.dtype).t()

    def _int8_forward_cpu(self, x2: torch.Tensor) -> torch.Tensor:
        xb = x2.to(torch.bfloat16)
        if xb.shape[0] > CPU_INT8_GEMV_ROWS:
            return xb @ self._int8_weight(torch.bfloat16).t()
        g = self.qweight.shape[2]
        y = None
        for i in range(self.qweight.shape[0]):
            part = torch.ops.aten._weight_int8pack_mm(xb[:, i * g:(i + 1) * g].contiguous(), self.qweight[i],
                                                      self.scales[i]).float()
            y = part if y is None else y + part
        return y

    def padded_rows(self) -> int:
        """Zero output rows the layout holds past out_features (cpu_int4 and triton tile 16 rows)."""
        if self.layout == "triton":
            return self.qweight.shape[1] * 16 - self.out_features
        if self.layout == "cpu_int4":
            return self.scales_and_zeros.shape[1] - self.out_features
        return 0

    def forward_glu(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate)·up for a module whose output rows are [gate | up] (the GPU engine's fused MLP
        projection): on the Triton layout one GEMM with the product in its epilogue where the
        dispatch allows it (runtime/ops/w4a16/triton.py `w4a16_glu`); elsewhere the forward, then
        silu·mul (the fused kernel on CUDA)."""
        if self.layout != "triton" or self.padded_rows():
            if not (x.is_cuda and _triton_available()):
                from salactl.runtime.ops.fused.reference import silu_mul

                return silu_mul(self(x))
            from salactl.runtime.ops.fused.triton import silu_mul

            y = silu_mul(self(x).reshape(-1, self.out_features))
            return y.reshape(*x.shape[:-1], self.out_features // 2)
        from salactl.runtime.ops.w4a16.triton import w4a16_glu

        y = w4a16_glu(_sixteen_bit(self._rows(x)), self.qweight.contiguous(), self.scales.contiguous(), self.group_size)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features // 2)

    def bf16_rows(self) -> float:
        """Up to how many rows a call computes in bf16 whatever the model's dtype (forward's
        dispatch; the roofline floors those FLOPs at the bf16 rate): every row for the int4 kernels
        (CPU, Triton), triton8 and CPU int8; the Triton W8A16 kernel's rows for CUDA int8, above
        which the weight is dequantized to the model's dtype; none for the dequantizing reference."""
        if self.layout in ("triton", "cpu_int4", "triton8") or (self.layout == "int8" and self.qweight.device.type == "cpu"):
            return math.inf
        if self.layout == "int8" and _triton_available():
            from salactl.runtime.ops.w8a16.triton import MAX_ROWS, group_fits

            return MAX_ROWS if group_fits(self.qweight.shape[2]) else 0
        return 0

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """x as [rows, in_features], gathered by the act-order permutation when there is one."""
        x2 = x.reshape(-1, self.in_features)
        return x2 if self.perm is None else x2[:, self.perm]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = self._rows(x)
        if self.layout == "triton":
            from salactl.runtime.ops.w4a16.triton import w4a16_linear

            # .contiguous(): no copy, except for the views the GPU engine's fused projections leave
            y = w4a16_linear(_sixteen_bit(x2), self.qweight.contiguous(), self.scales.contiguous(),
                             self.group_size)[:, :self.out_features].to(x.dtype)
        elif self.layout == "cpu_int4":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.to(torch.bfloat16).contiguous(), self.qweight,
                                                            self.kernel_group, self.scales_and_zeros)
            y = y[:, :self.out_features].to(x.dtype)
        elif self.layout == "triton8":
            y = self._triton8_forward(x2).to(x.dtype)
        elif self.layout == "int8":
            y = self._int8_forward(x2).to(x.dtype)
        else:
            y = reference.w4a16_matmul(x2, self.qweight, self.scales, self.g_idx, self.bits)
        return y.reshape(*shape[:-1], self.out_features)
