"""Starting a thread as a capacity check: a thread this machine cannot start (RuntimeError: can't
start new thread, from `ulimit -u` or from `ulimit -v`, as each thread reserves its stack) is exit 11
with the limits named, never a traceback nor a request failure blamed on the server."""

from __future__ import annotations

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
