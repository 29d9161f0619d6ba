"""Run the GPU test files in parallel pytest shards (for the GPU machine).

    python tools/gpu_tests.py [--shards 10] [--timeout 530] [--kill-after 30] [--out DIR] [FILE ...]

FILE: test files of this repository (default: every tests/test_*.py that marks a test `@gpu` or
`pytest.mark.gpu`, picks its device with `"cuda" if torch.cuda.is_available()`, or is in
BOTH_DEVICES); run from the repo root. A file that fails to collect (e.g. an import error) stops
the run with pytest's errors.

Cold Triton compilation dominates these tests (one file took > 200 s alone); compiling in N
processes at once uses the host's cores, and the kernels themselves share the GPU. Test ids are
collected once and dealt round-robin, so parametrized variants of one kernel spread over shards.
A shard past --timeout gets SIGINT, so pytest still prints its summary, and SIGKILL --kill-after
seconds later if it is still running; either way its line says TIMED OUT. Each shard's log goes to
DIR/shardI.txt; stdout gets one summary line per shard, then every FAILED/ERROR line and the end of
each failing shard's tracebacks (the logs may stay on a machine that is handed back). Exit status:
1 if any shard failed or timed out, else 0.

pytest-xdist would do the same but is not installed on the GPU machine (no network); this needs
nothing beyond pytest.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

# files that run on whichever device there is but match neither GPU_MARKS nor DEVICE_CHOICE
BOTH_DEVICES = ("test_flex_sparse_engine.py",)
GPU_MARKS = ("@gpu", "pytest.mark.gpu")
# a file that builds its engine/model on the GPU when there is one (else on the CPU, in Triton's interpreter)
DEVICE_CHOICE = re.compile(r"""["']cuda["'] if torch\.cuda\.is_available\(\)""")
# timeout(1)'s status after the SIGINT at --timeout; after the SIGKILL at --kill-after, which it sends to
# its whole process group (itself included), 137 or, as Popen reports timeout's own death, -9
TIMED_OUT = (124, 137, -9)
# Linux's limit on one command-line argument (MAX_ARG_STRLEN); each test id is one
MAX_ARG_BYTES = 128 * 1024


def gpu_test_files(root: Path = Path("tests")) -> list[str]:
    """Every test file that runs something on the GPU when there is one."""
    def on_gpu(f: Path) -> bool:
        text = f.read_text()
        return f.name in BOTH_DEVICES or any(m in text for m in GPU_MARKS) or bool(DEVICE_CHOICE.search(text))
    return sorted(str(f) for f in root.glob("test_*.py") if on_gpu(f))


def collect(files: list[str]) -> list[str]:
    """The test ids in `files`; exits with pytest's output when any file fails to collect."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                       capture_output=True, text=True)
    ids = [ln for ln in r.stdout.splitlines() if "::" in ln]
    if r.returncode not in (0, 5):          # 5: nothing collected, reported below
        raise SystemExit(f"collecting the tests failed (pytest exit status {r.returncode}):\n"
                         f"{r.stdout[-6000:]}{r.stderr[-2000:]}")
    if not ids:
        raise SystemExit(f"no tests collected from {' '.join(files)}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    too_long = [i for i in ids if len(i.encode()) >= MAX_ARG_BYTES]
    if too_long:
        raise SystemExit(f"{len(too_long)} test ids are too long for a command line (one argument holds less than "
                         f"{MAX_ARG_BYTES} bytes), e.g. {too_long[0][:200]}...; give that parametrization short ids")
    return ids


def failure_details(lines: list[str], most: int = 80) -> list[str]:
    """The last `most` lines of a pytest log's FAILURES/ERRORS sections (its tracebacks)."""
    start = next((i for i, ln in enumerate(lines) if ln.startswith("=") and ("FAILURES" in ln or "ERRORS" in ln)), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(lines)) if "short test summary info" in lines[i]), len(lines))
    return lines[start:end][-most:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=530.0, help="seconds per shard before SIGINT")
    ap.add_argument("--kill-after", type=float, default=30.0,
                    help="seconds after the SIGINT before SIGKILL, for a shard that ignores it")
    ap.add_argument("--out", default="out/gpu-tests")
    a = ap.parse_args()
    ids = collect(a.files or gpu_test_files())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shards = [ids[i::a.shards] for i in range(min(a.shards, len(ids)))]
    procs = []
    for i, shard in enumerate(shards):
        log = open(out / f"shard{i}.txt", "w")
        cmd = ["timeout", "-s", "INT", "-k", str(a.kill_after), str(a.timeout),
               sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *shard]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    bad = False
    failures, details = [], []
    for i, (p, log) in enumerate(procs):
        rc = p.wait()
        log.close()
        bad |= rc not in (0, 5)
        lines = (out / f"shard{i}.txt").read_text().splitlines()
        last = lines[-1] if lines else "(no output)"
        timed_out = f"TIMED OUT after {a.timeout:g} s; " if rc in TIMED_OUT else ""
        print(f"shard{i} ({len(shards[i])} tests, rc {rc}): {timed_out}{last}")
        failures += [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        details += failure_details(lines)
    for ln in failures:
        print(ln)
    for ln in details:
        print(ln)
    print(f"{len(ids)} tests in {len(shards)} shards; logs in {out}/")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
