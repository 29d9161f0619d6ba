"""The embedded runtime as a bench target: requests go straight to a `StreamingEngine` in this
process (today `FifoEngine` over the single-sequence Engine), with ignore_eos, temperature 0 and
a fixed output length, as SOAR's client asks of a server. On CUDA it also reports the phase's
peak GPU memory and, through NVML, energy and mean power."""

from __future__ import annotations

import threading
import time

import torch

from salactl.bench.requests import BenchRequest
from salactl.bench.targets.base import Chunk, RequestFailed, Target
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
            raise RequestFailed(f"{type(e).__name__}: {e}") from e

    def phase_begin(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._t0 = time.perf_counter()
        self._e0 = self._energy.read_j() if self._energy else None

    def phase_end(self, output_tokens: int) -> dict:
        if self.device.type != "cuda":
            return {}
        torch.cuda.synchronize(self.device)
        out = {"peak_gpu_memory_bytes": int(torch.cuda.max_memory_allocated(self.device))}
        e1 = self._energy.read_j() if self._energy else None
        if self._e0 is not None and e1 is not None:
            joules, secs = e1 - self._e0, time.perf_counter() - self._t0
            out.update(energy_j=joules, mean_power_w=joules / secs if secs > 0 else None,
                       energy_per_output_token_j=joules / output_tokens if output_tokens else None)
        return out

    def knobs(self) -> dict:
        return dict(self._knobs, scheduler=f"fifo (max batch {self.max_batch_size})")

    def close(self) -> None:
        self.engine.close()


def build_embedded_target(model: str | None, random_weights: bool, seed: int, device: str,
                          dtype: str, chunk_size: int, tokenizer=None) -> tuple[EmbeddedTarget, object]:
    """Load the model and wrap it; returns (target, LoadedModel)."""
    from salactl.bench.targets.fifo_engine import FifoEngine
    from salactl.runtime.engine import Engine
    from salactl.runtime.loader import load_model

    lm = load_model(model or "sala-nano", device, dtype, random_weights, seed)
    dev = lm.model.model.embed_tokens.weight.device
    engine = Engine(lm.model, dev, chunk_size=chunk_size)
    eos = tuple(lm.config.eos_token_id) + (tuple(tokenizer.eos_ids) if tokenizer else ())
    knobs = {"device": str(dev), "dtype": str(lm.model.model.embed_tokens.weight.dtype).replace("torch.", ""),
             "chunk_size": chunk_size, "random_weights": random_weights, "seed": seed,
             "sparse_config": lm.config.sparse_config.__dict__.copy()}
    return EmbeddedTarget(FifoEngine(engine, eos), lm.source, lm.config.vocab_size, dev, knobs), lm
