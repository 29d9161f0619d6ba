"""Open-file limits of an HTTP bench: every request in flight holds a socket."""

from __future__ import annotations

import math

from salactl import output
from salactl.errors import CapacityError

OPEN_FILES_WANTED = 65535   # the soft RLIMIT_NOFILE SGLang's bench_serving raises itself to
OWN_FILES = 64              # descriptors kept for the process's own files (imports, records, the probe)


def check_open_files(plans) -> None:
    """Each request in flight holds a socket: raise the soft open-files limit as SGLang's bench_serving
    does, then refuse a phase that would still run out, before its first request, rather than fail
    the requests past the limit as if the server had. An open-loop phase (a finite request_rate, no
    max_concurrency) has as many in flight as the server's latency makes: it is warned of, not refused."""
    if not plans:
        return
    limit = raise_open_files_limit(max(len(p.requests) for p in plans) + OWN_FILES)
    if limit is None:
        return
    bounded = [p for p in plans if not _open_loop(p)]
    plan = max(bounded, key=_in_flight, default=None)
    if plan is not None and (need := _in_flight(plan) + OWN_FILES) > limit:
        raise CapacityError(f"phase {plan.phase.name} holds up to {_in_flight(plan)} requests in flight, a "
                            f"connection each, and needs {need} open files ({OWN_FILES} for salactl's own), "
                            f"but may open only {limit} (RLIMIT_NOFILE, raised as far as its hard limit allows); "
                            f"run `ulimit -n {need}` first (raising the hard limit may need root), or lower the "
                            "phase's max_concurrency or --num-requests")
    for plan in plans:
        if _open_loop(plan) and len(plan.requests) + OWN_FILES > limit:
            output.warn_once(
                f"phase {plan.phase.name} sends {len(plan.requests)} requests at {plan.phase.request_rate:g} "
                f"req/s with no max_concurrency, and salactl may open only {limit} files (RLIMIT_NOFILE): "
                f"should more than {limit - OWN_FILES} be in flight at once, those past it fail; give the "
                f"phase a max_concurrency of at most {limit - OWN_FILES} or run `ulimit -n "
                f"{len(plan.requests) + OWN_FILES}` first to rule that out")


def _open_loop(plan) -> bool:
    return plan.phase.max_concurrency is None and not math.isinf(plan.phase.request_rate)


def _in_flight(plan) -> int:
    """The most requests of a phase with a bounded concurrency in flight at once."""
    return min(plan.phase.max_concurrency or len(plan.requests), len(plan.requests))


def raise_open_files_limit(need: int = 0) -> int | None:
    """The soft RLIMIT_NOFILE raised to OPEN_FILES_WANTED, or to `need` where that is more, but never
    past the hard limit; None where there is no such limit (Windows) or it is unlimited."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(OPEN_FILES_WANTED, need)
    want = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):       # macOS refuses more than OPEN_MAX under an unlimited hard limit
            pass
    return None if soft == resource.RLIM_INFINITY else soft
