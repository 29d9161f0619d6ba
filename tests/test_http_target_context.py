"""`with HttpTarget(...) as target:` closes the target on the way out, error or not: its watchdog
thread (started by the first request, the probe) is gone afterwards."""

import threading

import pytest

from bench_server import FakeServer
from salactl.bench.targets.http import HttpTarget


def _watchdogs() -> set:
    return {t for t in threading.enumerate() if t.name == "salactl-http-watchdog"}


def test_leaving_the_with_block_ends_the_watchdog_thread():
    before = _watchdogs()
    with FakeServer(0.01, 0.001) as srv:
        with HttpTarget(srv.url, "openai", flush_sleep_s=0.0) as target:
            target.check()
            assert len(_watchdogs() - before) == 1
    assert not _watchdogs() - before


def test_an_error_inside_the_with_block_still_closes_the_target():
    before = _watchdogs()
    with FakeServer(0.01, 0.001) as srv:
        with pytest.raises(KeyError):
            with HttpTarget(srv.url, "openai", flush_sleep_s=0.0) as target:
                target.check()
                raise KeyError("the caller's own error")
    assert not _watchdogs() - before
