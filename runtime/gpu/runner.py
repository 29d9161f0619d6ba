"""Runs forward calls of the (fused) model over the paged caches: eager prefill chunks and
decode steps, the latter replayed from CUDA graphs captured per batch-size bucket.

Decode inputs live in one static int64 buffer [3, max_bs] (token ids, positions, slots) filled
from a pinned host buffer by one copy per step; padded rows point at the trash slot/page, so
their writes never reach a live request. Two graphs per bucket: dense (every row below
dense_len: no selection) and sparse (selection on the GPU, per-row dense/sparse in the kernel).
Graphs are captured on first use (after an eager warm-up that compiles every kernel), or ahead
of time by capture_graphs, into one shared memory pool."""

from __future__ import annotations

import torch

from salactl.runtime.gpu.batch import GPUBatch, Segment
from salactl.runtime.op_timer import NULL_TIMER
from salactl.runtime.ops.selection import num_windows

BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class ModelRunner:
    def __init__(self, model, pools, backend, device, max_batch: int, cuda_graph: bool = True):
        self.model, self.pools, self.backend = model, pools, backend
        self.config = model.config
        self.device = torch.device(device)
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        self.buckets = sorted({b for b in BUCKETS if b < max_batch} | {max_batch})
        self.max_batch = max_batch
        self.static_in = torch.zeros(3, max_batch, dtype=torch.int64, device=self.device)
        self.host_in = torch.zeros(3, max_batch, dtype=torch.int64,
                                   pin_memory=self.device.type == "cuda")
        # host_in may be rewritten only once the previous step's copy out of it has run: the copy
        # is asynchronous, and a caller that does not sync between steps (graph replays sync
        # nothing) would otherwise feed the previous step the next step's tokens and positions
        self._host_in_read = torch.cuda.Event() if self.device.type == "cuda" else None
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None

    # ---- prefill ----------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, segments: list[tuple[int, list[int], int]], timer=NULL_TIMER) -> torch.Tensor:
        """segments: (slot, token ids, first position). Returns fp32 logits of each segment's
        last token [len(segments), V]."""
        ids, pos, slots, segs, last = [], [], [], [], []
        for slot, toks, p0 in segments:
            segs.append(Segment(slot, len(ids), len(toks), p0))
            ids += toks
            pos += range(p0, p0 + len(toks))
            slots += [slot] * len(toks)
            last.append(len(ids) - 1)
        dev = self.device
        host = torch.tensor([ids, pos, slots], dtype=torch.int64)
        t = host.to(dev, non_blocking=True)
        batch = GPUBatch.build(self.config, self.backend, t[1], t[2].to(torch.int32), decode=False,
                               segments=segs, timer=timer)
        try:
            logits = self.model(t[0], batch, torch.tensor(last, device=dev))
        except BaseException:           # an error or Ctrl-C: commit nothing for its slots
            self.backend.cancel_forward()
            raise
        self.backend.end_forward()
        return logits

    # ---- decode -----------------------------------------------------------------------------
    def _decode_forward(self, static, sparse: bool, timer=NULL_TIMER) -> torch.Tensor:
        batch = GPUBatch.build(self.config, self.backend, static[1], static[2].to(torch.int32),
                               decode=True, sparse=sparse, timer=timer)
        return self.model(static[0], batch)

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    @torch.inference_mode()
    def decode(self, rows: list[tuple[int, int, int]], timer=NULL_TIMER) -> torch.Tensor:
        """rows: (slot, token id, position). Returns fp32 logits [len(rows), V] (a copy: the
        graph's output buffer is overwritten by the next replay)."""
        n = len(rows)
        sc = self.config.sparse_config
        sparse = any(p + 1 >= sc.dense_len for _, _, p in rows)
        if sparse:            # compressed keys must cover every cached token of every row
            for slot, _, p in rows:
                self.backend.catch_up_k1(slot, p)
        use_graph = self.cuda_graph and timer is NULL_TIMER
        bs = self.bucket(n) if use_graph else n
        h = self.host_in
        if self._host_in_read is not None:
            self._host_in_read.synchronize()
        # one tensor and one copy per step: this host work is not overlapped with the GPU
        h[:, :n] = torch.tensor([[r[1] for r in rows], [r[2] for r in rows], [r[0] for r in rows]])
        if bs > n:
            h[:, n:bs] = 0
            h[2, n:bs] = self.pools.trash_slot
        self.static_in[:, :bs].copy_(h[:, :bs], non_blocking=True)
        if self._host_in_read is not None:
            self._host_in_read.record()
        if not use_graph:
            out = self._decode_forward(self.static_in[:, :n], sparse, timer)
        else:
            graph, out = self._graph(bs, sparse)
            graph.replay()
        if sparse:
            for slot, _, p in rows:
                self.backend.k1_have[slot] = num_windows(p + 1, sc)
        return out[:n].clone() if use_graph else out

    @torch.inference_mode()
    def capture_graphs(self, rows: int, dense: bool, sparse: bool) -> int:
        """Capture now the decode graphs a step of up to `rows` requests can replay (each bucket up
        to bucket(rows); the dense and/or the sparse ones), largest first so the smaller ones fit in
        the pool it leaves; returns how many were captured (0 without CUDA graphs)."""
        if not self.cuda_graph:
            return 0
        top = self.bucket(max(1, min(rows, self.max_batch)))
        kinds = [s for s, wanted in ((False, dense), (True, sparse)) if wanted]
        keys = [(b, s) for b in reversed(self.buckets) if b <= top for s in kinds]
        todo = [k for k in keys if k not in self.graphs]
        for bs, s in todo:
            self._graph(bs, s)
        return len(todo)

    def _graph(self, bs: int, sparse: bool):
        key = (bs, sparse)
        if key not in self.graphs:
            static = self.static_in[:, :bs]
            saved = static.clone()
            static.zero_()
            static[2].fill_(self.pools.trash_slot)        # warm-up and capture touch only trash
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._decode_forward(static, sparse)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._decode_forward(static, sparse)
            if self._pool is None:
                self._pool = graph.pool()
            self.graphs[key] = (graph, out)
            static.copy_(saved)
        return self.graphs[key]
