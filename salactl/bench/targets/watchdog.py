"""Wall-clock deadlines over blocking socket reads: a socket timeout bounds each read only, and
http.client reads a status line and headers line by line (skipping any number of interim
`100 Continue` answers), so a trickle of them would otherwise never time out. One thread serves
every watched socket (a heap of deadlines) and shuts a socket down when its deadline passes."""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from typing import TYPE_CHECKING

from salactl.bench.threads import start_thread

if TYPE_CHECKING:
    from salactl.bench.targets.http import Deadline


class Watch:
    """One socket under a Watchdog until its deadline."""
    __slots__ = ("sock", "queued", "stopped", "fired", "firing")

    def __init__(self, sock):
        self.sock, self.queued, self.stopped, self.fired, self.firing = sock, False, False, False, False


class Watchdog:
    """Shuts a watched socket down when its deadline passes, unless stopped first: a socket timeout
    bounds each read only, and http.client reads a status line and headers line by line (skipping
    any number of interim `100 Continue` answers), so a trickle of them would otherwise never time
    out. One thread per target serves every request's deadline (a heap of them); it starts on first
    use, the probe, so a thread this machine cannot start stops the bench before any request."""

    def __init__(self):
        self._cond = threading.Condition()
        self._heap: list = []               # (deadline end, sequence number, Watch)
        self._seq = itertools.count()
        self._stopped_in_heap = 0
        self._thread = None
        self._closing = False

    def watch(self, sock, deadline: Deadline) -> Watch:
        """Watch `sock` until `deadline` (raise TimeoutError when it has passed)."""
        watch = Watch(sock)
        if deadline.left() is None:
            return watch
        with self._cond:
            while self._closing:            # its thread ends once what it watches has ended
                self._cond.wait()
            if self._thread is None:
                thread = threading.Thread(target=self._run, daemon=True, name="salactl-http-watchdog")
                start_thread(thread.start, "HTTP request watchdog", "lower the phases' max_concurrency")
                self._thread = thread
            heapq.heappush(self._heap, (deadline.end, next(self._seq), watch))
            watch.queued = True
            if self._heap[0][2] is watch:
                self._cond.notify_all()     # an earlier deadline than the thread sleeps towards
        return watch

    def stop(self, watch: Watch) -> bool:
        """Stop watching; whether the deadline fired (its shutdown done by the time this returns)."""
        with self._cond:
            if watch.queued and not watch.stopped and not watch.fired:
                self._stopped_in_heap += 1      # left in the heap until its deadline or a clean-up
            watch.stopped = True
            if self._closing:
                self._cond.notify_all()         # the thread may end now
            while watch.firing:
                self._cond.wait()
            if self._stopped_in_heap > max(64, len(self._heap) // 2):      # a 6 h deadline outlives its request
                self._heap = [entry for entry in self._heap if not entry[2].stopped]
                heapq.heapify(self._heap)
                self._stopped_in_heap = 0
            return watch.fired

    def close(self) -> None:
        """End the thread once every watch it holds has stopped or fired; a watch meanwhile waits for
        that and then starts a new thread."""
        with self._cond:
            thread, self._closing = self._thread, True
            self._cond.notify_all()
        if thread is not None:
            thread.join()
        with self._cond:
            self._thread, self._closing = None, False
            self._heap, self._stopped_in_heap = [], 0       # stopped watches only
            self._cond.notify_all()

    def _run(self) -> None:
        with self._cond:
            while not (self._closing and self._stopped_in_heap == len(self._heap)):
                if not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                    continue
                watch = heapq.heappop(self._heap)[2]
                if watch.stopped:
                    self._stopped_in_heap -= 1
                    continue
                watch.fired = watch.firing = True
                sock = watch.sock
                self._cond.release()            # a shutdown may take a moment: other watches go on
                try:
                    # the plain socket's shutdown: SSLSocket's drops its TLS object under a concurrent read
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass
                finally:
                    self._cond.acquire()
                watch.firing = False
                self._cond.notify_all()
