"""The bench's request watchdog (salactl/bench/targets/watchdog.py) on real socket pairs: one thread
shuts each socket down at its deadline, an earlier deadline wakes it, stopped watches do not pile
up, and a watch made while the watchdog closes (close() waits for the watches it holds) is still
enforced."""

import socket
import threading
import time

from salactl.bench.targets.http import Deadline
from salactl.bench.targets.watchdog import Watchdog


WAIT = 30.0         # s: far past the deadlines below, short of the hour a missed wake-up sleeps towards


def shut_within(sock, seconds: float = WAIT) -> float:
    """Seconds until a read on `sock` ends (the watchdog shut it down); fails past `seconds`."""
    sock.settimeout(seconds)
    t = time.monotonic()
    assert sock.recv(1) == b""          # a shut socket reads as closed; a timeout raises instead
    return time.monotonic() - t


def test_an_earlier_deadline_wakes_the_thread_sleeping_towards_a_later_one():
    wd = Watchdog()
    (late, _late_peer), (soon, _soon_peer) = socket.socketpair(), socket.socketpair()
    hour = wd.watch(late, Deadline(3600.0))
    try:
        time.sleep(0.1)                 # the thread now sleeps towards the hour
        w = wd.watch(soon, Deadline(0.3))
        assert shut_within(soon) < 10.0     # 0.3 s, plus any stall of a loaded CI machine
        assert wd.stop(w) is True and wd.stop(hour) is False
    finally:
        wd.stop(hour)                   # close() waits for the watches it holds
        wd.close()
        for s in (late, _late_peer, soon, _soon_peer):
            s.close()


def test_stopped_watches_with_long_deadlines_do_not_pile_up():
    wd = Watchdog()
    a, b = socket.socketpair()
    try:
        for _ in range(1000):
            assert wd.stop(wd.watch(a, Deadline(21600.0))) is False
        assert len(wd._heap) <= 2 * 64 + 1
    finally:
        wd.close()
        a.close()
        b.close()


def test_a_watch_made_while_the_watchdog_closes_is_enforced():
    wd = Watchdog()
    (held, held_peer), (late, late_peer) = socket.socketpair(), socket.socketpair()
    first = wd.watch(held, Deadline(3600.0))
    try:
        closer = threading.Thread(target=wd.close)
        closer.start()                  # waits for `first`, which is still live
        time.sleep(0.1)
        assert closer.is_alive()
        threading.Timer(0.3, wd.stop, (first,)).start()
        w = wd.watch(late, Deadline(1.0))     # waits for the close, then starts a new thread
        closer.join(WAIT)
        assert not closer.is_alive()
        assert shut_within(late) < 10.0
        assert wd.stop(w) is True
    finally:
        wd.stop(first)
        wd.close()
        for s in (held, held_peer, late, late_peer):
            s.close()
    assert wd._thread is None
