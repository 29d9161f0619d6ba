"""The embedded runtime as a bench target: requests go straight to an `EngineDriver` in this
process (over the GPU engine's continuous batching, or the single-sequence Engine in FIFO order), with ignore_eos, temperature 0 and a fixed output length, as SOAR's client asks
of a server. On CUDA it also reports the phase's
peak GPU memory and, through NVML, energy and mean power; on the GPU engine, the bytes its cache
pools reserve (sized from the free memory, they are most of that peak)."""

from __future__ import annotations

import threading
import time

import torch

from salactl import output
from salactl.bench.out_of_memory import capacity_error, is_out_of_memory, out_of_memory_is_capacity
from salactl.bench.requests import BenchRequest
from salactl.bench.targets.base import Chunk, RequestFailed, Target
from salactl.errors import UsageError
from salactl.bench.engine_options import gpu_engine_sizes
from salactl.runtime.sampling import SamplingParams


class _Energy:
    """NVML total-energy counter of the engine's GPU (None when unavailable)."""

    def __init__(self, device: torch.device):
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception:
            self.handle = None

    def read_j(self) -> float | None:
        if self.handle is None:
            return None
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
        except Exception:
            return None


class EmbeddedTarget(Target):
    kind = "embedded"

    def __init__(self, engine, model_name: str, vocab_size: int, device: torch.device,
                 knobs: dict | None = None):
        self.engine, self.model, self.vocab_size = engine, model_name, vocab_size
        self.device = torch.device(device)
        self.max_batch_size = engine.max_batch_size
        self._knobs = dict(knobs or {})
        self._energy = _Energy(self.device) if self.device.type == "cuda" else None
        self._t0 = self._e0 = None
        self._cache_pool_bytes = cache_pool_bytes(engine)

    def stream(self, request: BenchRequest, max_tokens: int, cancel: threading.Event):
        if request.prompt_ids is None:
            raise RequestFailed("the embedded target needs token ids; the dataset was not tokenized")
        params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        n = 0
        try:
            for _tok, ts in self.engine.submit(list(request.prompt_ids), params, cancel):
                n += 1
                yield Chunk(ts, n)
        except RequestFailed:
            raise
        except Exception as e:
            cause = capacity_error("the embedded engine", "lower --chunk-size or the prompt lengths", e) \
                if is_out_of_memory(e) else e
            raise RequestFailed(f"{type(e).__name__}: {e}") from cause

    def prepare(self, max_concurrency: int, first_position: int, last_position: int) -> None:
        with out_of_memory_is_capacity("the embedded engine's decode CUDA-graph capture",
                                       "lower --max-running-requests or --mem-fraction"):
            self.engine.prepare(max_concurrency, first_position, last_position)

    def phase_begin(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._t0 = time.perf_counter()
        self._e0 = self._energy.read_j() if self._energy else None

    def phase_end(self, output_tokens: int) -> dict:
        pools = {} if self._cache_pool_bytes is None else {"cache_pool_bytes": self._cache_pool_bytes}
        if self.device.type != "cuda":
            return pools
        torch.cuda.synchronize(self.device)
        out = {"peak_gpu_memory_bytes": int(torch.cuda.max_memory_allocated(self.device)), **pools}
        e1 = self._energy.read_j() if self._energy else None
        if self._e0 is not None and e1 is not None:
            joules, secs = e1 - self._e0, time.perf_counter() - self._t0
            out.update(energy_j=joules, mean_power_w=joules / secs if secs > 0 else None,
                       energy_per_output_token_j=joules / output_tokens if output_tokens else None)
        return out

    def knobs(self) -> dict:
        return dict(self._knobs)

    def close(self) -> None:
        self.engine.close()


def cache_pool_bytes(driver) -> int | None:
    """Bytes of the GPU engine's cache pools behind an EngineDriver; None for the reference Engine,
    whose cache grows with its request (or a stepper over no engine)."""
    pools = getattr(getattr(driver.stepper, "engine", None), "pools", None)
    return None if pools is None else pools.nbytes()


ENGINES = ("auto", "reference", "gpu")


def resolve_engine(engine: str, device: torch.device) -> str:
    """"gpu" or "reference" for --engine auto|reference|gpu on this device."""
    from salactl.errors import DeviceError

    if engine not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "reference":
        return "reference"
    try:
        from salactl.runtime.gpu.available import gpu_engine_available

        available = gpu_engine_available(device)
    except ImportError:
        available = False
    if engine == "gpu" and not available:
        raise DeviceError("--engine gpu needs a CUDA device, Triton and the GPU engine; "
                          "use --engine reference")
    return "gpu" if available else "reference"


DEFAULT_CHUNK = {"gpu": 8192, "reference": 512}     # 8192 = SOAR's --chunked-prefill-size


def build_engine(model, device, engine: str, chunk_size: int | None, kv_cache_dtype: str,
                 max_running: int | None = None, mem_fraction: float | None = None):
    """The stepping engine behind the target: the continuous-batching GPU engine when asked for
    (or `auto` on CUDA with Triton; its caches take mem_fraction of the free GPU memory), else the
    single-sequence reference Engine in FIFO order. max_running/mem_fraction None: the GPU
    engine's defaults (bench and sweep refuse them for the reference engine). Returns
    (EngineDriver, engine name, chunk size). Bench requests ignore EOS: no stop set."""
    from salactl.bench.targets.engine_driver import EngineDriver, GpuStepper, SerialStepper

    kind = resolve_engine(engine, device)
    chunk_size = chunk_size or DEFAULT_CHUNK[kind]
    if kind == "gpu":
        from salactl.runtime.gpu.engine import GPUEngine

        max_running, mem_fraction = gpu_engine_sizes(max_running, mem_fraction)
        gpu = GPUEngine(model, device, chunk_size=chunk_size, max_running_requests=max_running,
                        kv_cache_dtype=kv_cache_dtype, mem_fraction=mem_fraction)
        for note in gpu.fallback_notes():
            output.warn_once(note)
        return EngineDriver(GpuStepper(gpu), max_running), "gpu", chunk_size
    from salactl.runtime.engine import Engine

    ref = Engine(model, device, chunk_size=chunk_size, kv_cache_dtype=kv_cache_dtype)
    return EngineDriver(SerialStepper(ref), 1), "reference", chunk_size


def build_embedded_target(model: str | None, random_weights: bool, seed: int, device: str, dtype: str,
                          chunk_size: int | None, engine: str = "auto", kv_cache_dtype: str = "bf16",
                          max_running: int | None = None,
                          mem_fraction: float | None = None) -> tuple[EmbeddedTarget, object]:
    """Load the model and wrap it; returns (target, LoadedModel)."""
    import dataclasses

    from salactl.quant.in_memory import quantized_as
    from salactl.runtime.kv_fp8 import check_scales_before_loading, stored_kv_name
    from salactl.runtime.loader import load_model, model_config, model_dir

    check_scales_before_loading(model_config(model, random_weights), model_dir(model, random_weights),
                                random_weights, kv_cache_dtype)
    lm = load_model(model, device, dtype, random_weights, seed)
    dev = lm.model.device
    driver, engine_name, chunk_size = build_engine(lm.model, dev, engine, chunk_size, kv_cache_dtype, max_running,
                                                   mem_fraction)
    act_dtype = lm.model.model.embed_tokens.weight.dtype
    dtype_name = str(act_dtype).replace("torch.", "")
    knobs = {"engine": engine_name, "device": str(dev), "dtype": dtype_name,
             "weights": quantized_as(lm.model) or dtype_name,     # as `run` records name them
             "kv_cache_dtype": stored_kv_name(kv_cache_dtype, act_dtype),
             "chunk_size": chunk_size, "max_running_requests": driver.max_batch_size,
             "mem_fraction": gpu_engine_sizes(max_running, mem_fraction)[1] if engine_name == "gpu" else None,
             "random_weights": random_weights, "seed": seed,
             "sparse_config": dataclasses.asdict(lm.config.sparse_config)}
    return EmbeddedTarget(driver, lm.source, lm.config.vocab_size, dev, knobs), lm

