"""Starting a thread as a capacity check: a thread this machine cannot start (RuntimeError: can't
start new thread, from `ulimit -u` or from `ulimit -v`, as each thread reserves its stack) is exit 11
with the limits named, never a traceback nor a request failure blamed on the server. And the bench's
client threads, one per request in flight."""

from __future__ import annotations

import math
import queue
import threading

from salactl.errors import CapacityError

try:
    import resource                 # the limits a failed thread start names
except ImportError:                 # Windows
    resource = None


def start_thread(start, what: str, fix: str) -> None:
    """Call `start` (a Thread's start, or a call that starts one); a thread this machine cannot
    start (RuntimeError: can't start new thread) is its CapacityError, exit 11."""
    try:
        start()
    except RuntimeError as e:
        raise CapacityError(f"this machine ran out of threads starting the {what} ({e}; {_thread_limits()}); "
                            f"raise `ulimit -u` (threads per user) or `ulimit -v` (each thread reserves "
                            f"its stack, 8 MiB by default), or {fix}") from None


def _thread_limits() -> str:
    if resource is None:
        return "its thread limits"
    nproc, space = resource.getrlimit(resource.RLIMIT_NPROC)[0], resource.getrlimit(resource.RLIMIT_AS)[0]
    unlimited = resource.RLIM_INFINITY
    return (f"ulimit -u {'unlimited' if nproc == unlimited else nproc}, "
            f"ulimit -v {'unlimited' if space == unlimited else space // 1024}")


SPARE_CLIENTS = 32      # idle client threads an open-loop phase keeps started ahead of its arrivals


class ClientPool:
    """The client threads of one phase, each taking items from `todo` and handing them to `serve`
    (False: stop). A fixed pool starts all `size` threads before the clock. An elastic one (an
    open-loop phase: requests leave on their own clock, however many are in flight) starts
    SPARE_CLIENTS and, from a background thread, keeps SPARE_CLIENTS idle ones ahead of the dispatcher,
    up to `size`, so that a request rarely waits for a thread to start and the threads number the
    requests in flight, not the phase's requests. Only when none is idle does the dispatcher start one
    itself, after queueing its request."""

    def __init__(self, serve, size: int, elastic: bool, phase: str, fix: str):
        self.todo: queue.Queue = queue.Queue()
        self._serve, self._size, self._elastic, self._phase, self._fix = serve, size, elastic, phase, fix
        self._lock = threading.Lock()
        self._started = 0       # threads started (or being started)
        self._idle = 0          # started threads minus requests queued or being served
        self._low = threading.Event()   # wakes the top-up thread
        self._closing = False
        self._top_up_thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the first client threads (and the top-up thread) and return once all run."""
        first = min(SPARE_CLIENTS, self._size) if self._elastic else self._size
        ready = threading.Barrier(first + 1)
        try:
            for _ in range(first):
                self._start_client(ready)
            if self._elastic:
                self._top_up_thread = threading.Thread(target=self._top_up, daemon=True,
                                                       name=f"bench-top-up-{self._phase}")
                start_thread(self._top_up_thread.start, f"client top-up thread of phase {self._phase}", self._fix)
        except CapacityError:
            ready.abort()
            raise
        ready.wait()

    def dispatch(self, item) -> None:
        """Queue `item` for the next idle client thread, starting one only when none is idle."""
        with self._lock:
            self._idle -= 1
            none_idle = self._idle < 0
            low = self._elastic and self._idle < SPARE_CLIENTS
        self.todo.put(item)
        if none_idle:
            self._start_client(idle_below=0)      # unless the top-up thread just started one
        if low:
            self._low.set()

    def close(self) -> None:
        """Stop topping up, then let every client thread end once it has no request left."""
        self._closing = True
        self._low.set()
        if self._top_up_thread is not None:
            self._top_up_thread.join()
        for _ in range(self._started):
            self.todo.put(None)

    def _start_client(self, ready: threading.Barrier | None = None, idle_below: float = math.inf) -> bool:
        """Start one more client thread, unless the pool is full or closing or has `idle_below` idle ones."""
        with self._lock:
            if self._started >= self._size or self._closing or self._idle >= idle_below:
                return False
            self._started += 1
            self._idle += 1
            k = self._started
        t = threading.Thread(target=self._client, args=(ready,), daemon=True, name=f"bench-client-{k}")
        try:
            start_thread(t.start, f"client thread {k} of phase {self._phase}'s {self._size}", self._fix)
        except CapacityError:
            # counted but never running: left counted, a request would queue behind a busy thread
            with self._lock:
                self._started -= 1
                self._idle -= 1
            raise
        return True

    def _client(self, ready: threading.Barrier | None) -> None:
        if ready is not None:
            try:
                ready.wait()
            except threading.BrokenBarrierError:    # a later client thread could not start
                return
        while (item := self.todo.get()) is not None and self._serve(item):
            with self._lock:
                self._idle += 1

    def _top_up(self) -> None:
        # a failed start ends the topping up only: the dispatcher raises it once a request needs a thread
        while not self._closing:
            self._low.wait()
            self._low.clear()
            try:
                while self._start_client(idle_below=SPARE_CLIENTS):
                    pass
            except CapacityError:
                return
