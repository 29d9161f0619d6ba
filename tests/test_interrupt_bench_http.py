"""Ctrl-C during a bench phase against a server: the client threads open no further connection,
and the requests cut short count neither as done nor as failed on the progress bar."""

import os
import signal
import threading
import time

import pytest

from bench_server import FakeServer
from salactl.bench.profiles import Phase
from salactl.bench.runner import run_phase
from salactl.bench.synthetic import random_lengths
from salactl.bench.targets.base import RequestFailed
from salactl.bench.targets.http import HttpTarget


def _counting_connections(srv: FakeServer) -> list:
    """The times the server accepted a connection (the loopback server's own accept hook)."""
    accepted = []
    verify = srv.httpd.verify_request

    def count(request, address):
        accepted.append(time.perf_counter())
        return verify(request, address)

    srv.httpd.verify_request = count
    return accepted


class Advances:
    """The progress protocol of run_phase, keeping what the bar was told."""

    def __init__(self):
        self.results = []

    def begin(self, name, total): ...

    def advance(self, result):
        self.results.append(result)

    def end(self): ...


def test_ctrl_c_stops_the_client_threads_taking_requests():
    # 100 tokens: 10 s a request, so that none ends before the interrupt even on a stalled machine
    with FakeServer(ttft=0.05, per_token=0.1) as srv, \
            HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target:
        accepted = _counting_connections(srv)
        target.check()
        reqs = random_lengths(40, 8, 100, vocab_size=1000, seed=3)
        progress = Advances()
        at_interrupt = []

        def interrupt():
            at_interrupt.append(len(accepted))
            os.kill(os.getpid(), signal.SIGINT)

        timer = threading.Timer(0.4, interrupt)         # the first 4 requests are mid-stream
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                run_phase(target, Phase("P", max_concurrency=4, warmup_requests=0, flush_cache=False), reqs,
                          progress=progress)
        finally:
            timer.cancel()
        time.sleep(0.5)                                 # time for cut streams to end and threads to go on
    assert len(accepted) == at_interrupt[0]
    assert progress.results == []


def test_a_cancelled_request_does_not_connect():
    with FakeServer() as srv:
        accepted = _counting_connections(srv)
        (req,) = random_lengths(1, 8, 4, vocab_size=1000, seed=3)
        cancel = threading.Event()
        cancel.set()
        with HttpTarget(srv.url, "sglang", flush_sleep_s=0.0) as target, \
                pytest.raises(RequestFailed, match="cancelled"):
            list(target.stream(req, 4, cancel))
    assert accepted == []
