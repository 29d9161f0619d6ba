"""ClientPool on its own: the top-up thread keeps SPARE_CLIENTS idle client threads ahead of the
dispatcher, the dispatcher starts one itself when none is idle, every item is served once, close()
ends every thread, and a thread that fails to start is not left counted."""

import collections
import threading
import time

import pytest

from salactl.bench.threads import SPARE_CLIENTS, ClientPool
from salactl.errors import CapacityError


def _clients() -> int:
    return sum(t.name.startswith("bench-client-") for t in threading.enumerate())


def _top_up_running() -> bool:
    return any(t.name.startswith("bench-top-up-") for t in threading.enumerate())


def _wait(cond, timeout: float = 30.0) -> bool:
    """cond() became true within `timeout` s (ms here; the rest is room for a stalled CI machine)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


class Blocking:
    """A serve that records each item it enters, then blocks until released."""

    def __init__(self):
        self.entered, self.release, self._lock = [], threading.Event(), threading.Lock()

    def __call__(self, item) -> bool:
        with self._lock:
            self.entered.append(item)
        self.release.wait(60)            # a bound only in case the test never releases it
        return True


@pytest.fixture
def serve():
    return Blocking()


@pytest.fixture
def pools(serve):
    """The test's pools, closed after it even if it failed, so none of their threads outlives it."""
    pools = []
    yield pools
    serve.release.set()
    for pool in pools:
        pool.close()        # again, if the test did: a no-op then
    assert _wait(lambda: _clients() == 0 and not _top_up_running()), _clients()


def _closed(pool: ClientPool, serve: Blocking) -> bool:
    serve.release.set()
    pool.close()
    return _wait(lambda: _clients() == 0 and not _top_up_running())


class NoTopUp(ClientPool):
    """A pool whose top-up thread never starts a client: only the dispatcher's own starts remain."""

    def _top_up(self) -> None:
        pass


def test_a_fixed_pool_runs_all_its_threads_before_start_returns(serve, pools):
    pool = ClientPool(serve, 50, False, "P", "fix")
    pools.append(pool)
    pool.start()
    assert _clients() == 50
    assert _closed(pool, serve)


def test_the_top_up_thread_keeps_spare_clients_idle_ahead_of_the_dispatcher(serve, pools):
    pool = ClientPool(serve, 200, True, "P", "fix")
    pools.append(pool)
    pool.start()
    assert _clients() == SPARE_CLIENTS
    for i in range(40):
        pool.dispatch(i)
    assert _wait(lambda: _clients() >= 40 + SPARE_CLIENTS), _clients()
    assert _wait(lambda: len(serve.entered) == 40), len(serve.entered)
    assert _closed(pool, serve)


def test_the_dispatcher_starts_a_client_itself_when_none_is_idle(serve, pools):
    pool = NoTopUp(serve, 200, True, "P", "fix")
    pools.append(pool)
    pool.start()
    n = SPARE_CLIENTS + 5
    for i in range(n):
        pool.dispatch(i)
    assert _wait(lambda: len(serve.entered) == n), len(serve.entered)
    assert _clients() == n
    assert _closed(pool, serve)


@pytest.mark.parametrize("elastic", [True, False])
def test_every_item_is_served_exactly_once_and_close_ends_every_thread(elastic, pools):
    served, lock = [], threading.Lock()

    def serve(item) -> bool:
        time.sleep(0.0005)
        with lock:
            served.append(item)
        return True

    pool = ClientPool(serve, 100, elastic, "P", "fix")
    pools.append(pool)
    pool.start()
    for i in range(500):
        pool.dispatch(i)
    pool.close()
    assert _wait(lambda: _clients() == 0 and not _top_up_running()), _clients()
    assert collections.Counter(served) == collections.Counter(range(500))


def test_a_client_thread_that_fails_to_start_is_not_left_counted(monkeypatch, serve, pools):
    # The pool builds its own threading.Thread, so the failure is made there, for its client threads
    # past `limit` only (by the name the pool gives them); monkeypatch undoes it after the test.
    limit, start = SPARE_CLIENTS + 8, threading.Thread.start

    def start_up_to_limit(thread):
        if thread.name.startswith("bench-client-") and int(thread.name.rsplit("-", 1)[1]) > limit:
            raise RuntimeError("can't start new thread")
        return start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_up_to_limit)
    pool = ClientPool(serve, 1000, True, "P", "fix")
    pools.append(pool)
    pool.start()
    busy = limit - SPARE_CLIENTS + 1      # the top-up thread tries thread limit+1, fails and ends
    for i in range(busy):
        pool.dispatch(i)
    assert _wait(lambda: not _top_up_running()), "the top-up thread never hit the limit"
    assert _clients() == limit
    for i in range(busy, limit):            # one per idle thread
        pool.dispatch(i)
    assert _wait(lambda: len(serve.entered) == limit), len(serve.entered)
    # none is idle now: this request needs thread limit+1, which cannot start, and says so
    with pytest.raises(CapacityError, match=f"client thread {limit + 1} of phase P's 1000"):
        pool.dispatch(limit)
    assert _closed(pool, serve)
