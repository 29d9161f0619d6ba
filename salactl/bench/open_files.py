"""Open-file limits of an HTTP bench: every request in flight holds a socket."""

from __future__ import annotations

from salactl.errors import CapacityError

OPEN_FILES_WANTED = 65535   # the soft RLIMIT_NOFILE SGLang's bench_serving raises itself to
OWN_FILES = 64              # descriptors kept for the process's own files (imports, records, the probe)


def check_open_files(plans) -> None:
    """Each request in flight holds a socket: raise the soft open-files limit as SGLang's bench_serving
    does, then refuse a phase that would still run out, before its first request, rather than fail
    the requests past the limit as if the server had."""
    if not plans:
        return
    plan = max(plans, key=_in_flight)
    need = _in_flight(plan) + OWN_FILES
    limit = raise_open_files_limit(need)
    if limit is None:
        return
    if need > limit:
        raise CapacityError(f"phase {plan.phase.name} holds up to {_in_flight(plan)} requests in flight, a "
                            f"connection each, and needs {need} open files ({OWN_FILES} for salactl's own), "
                            f"but may open only {limit} (RLIMIT_NOFILE, raised as far as its hard limit allows); "
                            f"run `ulimit -n {need}` first (raising the hard limit may need root), or lower the "
                            "phase's max_concurrency or --num-requests")


def _in_flight(plan) -> int:
    """The runner's client threads: the most requests of the phase in flight at once."""
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
