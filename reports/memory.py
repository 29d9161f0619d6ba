"""Analytic GPU memory of a MiniCPM-SALA deployment, by component (reference/architecture.md §5).

Hand-written arithmetic rather than a measured allocator trace: the point is to predict memory for
shapes and GPUs we do not have (the real 9B at 512K context on an 80 GB card), from the config alone.

Per request (context L tokens, held in ceil(L / block_size) pages of block_size tokens, as the GPU
engine's page pool allocates them):
- KV cache of the sparse (minicpm4) layers: pages · block_size · n_sparse · 2 (K,V) · Hkv · d ·
  kv_bytes (8 KiB/token in bf16 for the real model, 4 KiB in FP8).
- compressed keys: K1 (mean of 32 keys every 16; block_size / stride slots per page) per sparse
  layer and KV head, in the activation dtype; K2 (128/64, not paged) is
  what SGLang also keeps. Our runtime keeps K1 only (DESIGN.md §2: K2 is not needed by our exact
  selection), so K2 is counted only with compressed_keys="k1k2".
- GLA states: n_lightning · H · dk · dv fp32 (48 MiB for the real config), independent of L.
The full-attention comparison (every layer GQA softmax, no GLA state) counts the same whole pages.
Per server (fixed): weights (bf16, or W4A16 = qweight + qzeros + scales + g_idx for every linear
that `salactl quantize` quantizes: those that satisfy Marlin's shape rules, a fused group (q/k/v,
gate/up) all or none; the rest bf16), prefill activations/workspace for one chunk, CUDA-graph pool
and CUDA context (both estimates, labelled as such).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from salactl.errors import UsageError
from salactl.quant.in_memory import QUANTIZED_BITS
from salactl.quant.sequential import quantized_linears
from salactl.runtime.checkpoint import expected_tensor_shapes
from salactl.runtime.config import SalaConfig
from salactl.runtime.gpu.pools import k1_window_bytes, kv_token_bytes, slot_bytes
from salactl.runtime.kv_fp8 import KV_CACHE_DTYPES, kv_item_bytes

SERVING_ACT_BYTES = 2               # the analytic tables are of bf16 serving
# Names the engine's --kv-cache-dtype refuses but a memory plan may ask for: 16/32-bit caches by
# their usual names (run records store the activation dtype's, e.g. "bfloat16", "float32") and
# "fp8" for either FP8 format.
PLANNING_ONLY_KV_BYTES = {"bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4, "fp8": 1}
WEIGHT_DTYPES = ("bf16", *QUANTIZED_BITS)
COMPRESSED_KEY_MODES = ("k1", "k1k2")
K2_FACTOR = 4                       # K2 kernel and stride are 4x K1's (hard-coded in HF/SGLang)
CUDA_CONTEXT_ESTIMATE = 512 << 20   # driver + cuBLAS/cuDNN handles + allocator slack (estimate)

MIB, GB = 2**20, 10**9
# Total memory of each GPU, keyed like runtime/peaks.py DATASHEET names: nvidia-smi's memory.total
# (MiB) on those cards, as seen in its output. The datasheets' "80 GB" are GiB less a driver reserve,
# so reading them as 10^9 bytes came out ~7% low. CUDA's own total (torch.cuda.mem_get_info) can be
# a few hundred MiB below nvidia-smi's (81089 MiB on an H100 80GB HBM3 that nvidia-smi shows at 81559).
GPU_MEMORY_MIB = {
    "H200": 143771,
    "GH200 144G": 146831,
    "GH200": 97871,                 # the 96 GB HBM3 part ("NVIDIA GH200 480GB")
    "H100 SXM": 81559,
    "H100 80GB HBM3": 81559,
    "H100 NVL": 95830,
    "H100 PCIe": 81559,
    "H100": 81559,
    "A100-SXM4-80GB": 81920,
    "A100 80GB PCIe": 81920,
    "A100": 40960,                  # the 40 GB parts (an "A100 80GB" of another spelling: gpu_memory)
    "RTX PRO 6000": 97887,
    "RTX 5090": 32607,
    "L40S": 46068,
}
# No nvidia-smi total found for these: the datasheet's GB as 10^9 bytes (likely ~7% low, as above).
GPU_MEMORY_DATASHEET_GB = {
    "RTX PRO 6000D": 84,
}
GPU_NAMES = (*GPU_MEMORY_MIB, *GPU_MEMORY_DATASHEET_GB)


def kv_bytes_per_elem(kv_dtype: str, act_bytes: int = SERVING_ACT_BYTES) -> int:
    """Bytes of a stored K or V element: an engine name's as the engine stores it ("auto"/"bf16"
    in the activation dtype of `act_bytes`), a planning-only name's as named."""
    if kv_dtype in PLANNING_ONLY_KV_BYTES:
        return PLANNING_ONLY_KV_BYTES[kv_dtype]
    if kv_dtype in KV_CACHE_DTYPES:
        return kv_item_bytes(kv_dtype, act_bytes)
    raise UsageError(f"unknown KV cache dtype {kv_dtype!r}; "
                     f"valid: {', '.join(KV_CACHE_DTYPES)}, "
                     f"or for planning only: {', '.join(PLANNING_ONLY_KV_BYTES)}")


KV_DTYPE_BYTES = {name: kv_bytes_per_elem(name)
                  for name in (*KV_CACHE_DTYPES, *PLANNING_ONLY_KV_BYTES)}


def gpu_memory(name: str) -> tuple[int, str]:
    """(total bytes, "nvidia-smi" or "datasheet") of the known GPU whose name `name` contains
    (case-insensitive), the most specific name first."""
    for frag in sorted(GPU_NAMES, key=len, reverse=True):
        if frag.lower() in name.lower():
            if frag == "A100" and re.search(r"80\s*gb", name.lower()):     # "A100 80GB", "A100-80GB"
                frag = "A100-SXM4-80GB"
            if frag in GPU_MEMORY_MIB:
                return GPU_MEMORY_MIB[frag] * MIB, "nvidia-smi"
            return GPU_MEMORY_DATASHEET_GB[frag] * GB, "datasheet"
    raise UsageError(f"no memory size known for GPU {name!r}; known: {', '.join(GPU_NAMES)}; "
                     "or pass --gpu-mem GB")


# ---- weights ---------------------------------------------------------------------------------

def gptq_linear_bytes(k_in: int, n_out: int, group: int = 128, scale_bytes: int = 2, bits: int = 4) -> dict:
    """GPTQ v1 tensors of one Linear (reference/quantization.md §2): 32 // bits values per int32."""
    groups = 1 if group == -1 else math.ceil(k_in / group)
    per_word = 32 // bits
    return {"qweight": k_in // per_word * n_out * 4, "qzeros": groups * (n_out // per_word) * 4,
            "scales": groups * n_out * scale_bytes, "g_idx": k_in * 4}


@dataclass(frozen=True)
class WeightBytes:
    weights: str
    total: int
    params: int
    by_part: dict = field(default_factory=dict)    # qweight/qzeros/scales/g_idx/bf16 -> bytes

    def to_dict(self) -> dict:
        return asdict(self)


def weight_bytes(config: SalaConfig, weights: str = "bf16", group_size: int = 128,
                 act_bytes: int = 2) -> WeightBytes:
    if weights not in WEIGHT_DTYPES:
        raise UsageError(f"unknown --weights {weights!r}; valid: {', '.join(WEIGHT_DTYPES)}")
    shapes = expected_tensor_shapes(config)
    params = sum(math.prod(s) for s in shapes.values())
    if weights == "bf16":
        return WeightBytes("bf16", params * act_bytes, params, {"bf16": params * act_bytes})
    parts = {"qweight": 0, "qzeros": 0, "scales": 0, "g_idx": 0, "bf16": 0}
    quantized = {prefix + ".weight" for prefix in quantized_linears(config, group_size)}
    for name, shape in shapes.items():
        if name in quantized:
            linear = gptq_linear_bytes(shape[1], shape[0], group_size, act_bytes, QUANTIZED_BITS[weights])
            for k, v in linear.items():
                parts[k] += v
        else:
            parts["bf16"] += math.prod(shape) * act_bytes
    return WeightBytes(weights, sum(parts.values()), params, parts)


# ---- per request -----------------------------------------------------------------------------

def compressed_windows(length: int, kernel: int, stride: int) -> int:
    return 0 if length < kernel else (length - kernel) // stride + 1


@dataclass(frozen=True)
class RequestMemory:
    context: int
    kv_cache: int
    compressed_k1: int
    compressed_k2: int
    gla_state: int
    compressed_keys_kept: str

    @property
    def total(self) -> int:
        k2 = self.compressed_k2 if self.compressed_keys_kept == "k1k2" else 0
        return self.kv_cache + self.compressed_k1 + k2 + self.gla_state

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def kv_bytes_per_token(config: SalaConfig, kv_dtype: str = "bf16", layers: int | None = None,
                       act_bytes: int = SERVING_ACT_BYTES) -> int:
    return kv_token_bytes(config, kv_bytes_per_elem(kv_dtype, act_bytes), layers)


def request_memory(config: SalaConfig, context: int, kv_dtype: str = "bf16",
                   compressed_keys: str = "k1", key_bytes: int = SERVING_ACT_BYTES) -> RequestMemory:
    """key_bytes: the activation dtype's size, which the compressed keys and an "auto"/"bf16" KV
    cache are stored in."""
    if compressed_keys not in COMPRESSED_KEY_MODES:
        raise UsageError(f"unknown compressed-key mode {compressed_keys!r}; valid: k1 (our runtime), "
                         "k1k2 (SGLang)")
    if context < 0:
        raise UsageError(f"context length must be >= 0, got {context}")
    sc = config.sparse_config
    per_window = k1_window_bytes(config, key_bytes)
    pages = paged_tokens(config, context) // sc.block_size
    k1 = pages * (sc.block_size // sc.kernel_stride) * per_window
    k2 = compressed_windows(context, K2_FACTOR * sc.kernel_size, K2_FACTOR * sc.kernel_stride) * per_window
    kv = pages * sc.block_size * kv_bytes_per_token(config, kv_dtype, act_bytes=key_bytes)
    return RequestMemory(context, kv, k1, k2, slot_bytes(config), compressed_keys)   # the states: one GLA slot


def paged_tokens(config: SalaConfig, context: int) -> int:
    """Token slots holding `context` tokens: whole pages of block_size, as the GPU engine allocates them."""
    block = config.sparse_config.block_size
    return -(-context // block) * block


def full_attention_request(config: SalaConfig, context: int, kv_dtype: str = "bf16") -> int:
    """The same model with all layers GQA softmax attention: KV for every layer, in the same whole
    pages as request_memory's (so the two compare at any context), no GLA state."""
    per_token = kv_bytes_per_token(config, kv_dtype, layers=config.num_hidden_layers)
    return paged_tokens(config, context) * per_token


# ---- per server ------------------------------------------------------------------------------

def prefill_workspace_bytes(config: SalaConfig, chunk: int, act_bytes: int = 2) -> int:
    """Estimate of the live activations of one prefill chunk of `chunk` tokens, assuming fused
    attention (no materialised score matrix): residual + normed input, plus the wider of the MLP
    intermediates (gate, up, product) and the mixer's projections (q, k, v, gate) with the fp32
    q/k/v/o copies the GLA computes in; one fp32 logits row."""
    hidden, inter = config.hidden_size, config.intermediate_size
    hd = config.num_attention_heads * config.head_dim
    mlp = 3 * chunk * inter * act_bytes
    mixer = 4 * chunk * hd * act_bytes + 4 * chunk * hd * 4
    return 2 * chunk * hidden * act_bytes + max(mlp, mixer) + config.vocab_size * 4


def cuda_graph_pool_bytes(config: SalaConfig, max_batch: int) -> int:
    """Estimate: one pool shared by all decode graphs (captured largest bucket first), sized by
    the largest bucket's per-step intermediates in bf16; the graphs' own bookkeeping is not counted."""
    per_row = prefill_workspace_bytes(config, 1) - config.vocab_size * 4
    return max_batch * (per_row + config.vocab_size * 4)


@dataclass(frozen=True)
class ServerMemory:
    weights: WeightBytes
    prefill_chunk: int
    workspace: int
    cuda_graphs: int
    cuda_context: int

    @property
    def fixed(self) -> int:
        return self.weights.total + self.workspace + self.cuda_graphs + self.cuda_context

    def to_dict(self) -> dict:
        return {"weights": self.weights.to_dict(), "prefill_chunk": self.prefill_chunk,
                "workspace_estimate": self.workspace, "cuda_graphs_estimate": self.cuda_graphs,
                "cuda_context_estimate": self.cuda_context, "fixed": self.fixed}


def server_memory(config: SalaConfig, weights: str = "bf16", prefill_chunk: int = 8192,
                  max_batch: int = 32, cuda_graphs: bool = True, group_size: int = 128) -> ServerMemory:
    return ServerMemory(weight_bytes(config, weights, group_size), prefill_chunk,
                        prefill_workspace_bytes(config, prefill_chunk),
                        cuda_graph_pool_bytes(config, max_batch) if cuda_graphs else 0,
                        CUDA_CONTEXT_ESTIMATE)


def max_concurrent(gpu_bytes: int, mem_fraction: float, fixed: int, per_request: int) -> int:
    free = gpu_bytes * mem_fraction - fixed
    if free <= 0 or per_request <= 0:
        return 0
    return int(free // per_request)
