"""Run the GPU test files in parallel pytest shards (for the GPU machine).

    python tools/gpu_tests.py [--shards 10] [--timeout 530] [--out DIR] [FILE ...]

FILE: test files of this repository (default: every tests/test_*.py that marks a test `@gpu` or
`pytest.mark.gpu`, and BOTH_DEVICES); run from the repo root.

Cold Triton compilation dominates these tests (one file took > 200 s alone); compiling in N
processes at once uses the host's cores, and the kernels themselves share the GPU. Test ids are
collected once and dealt round-robin, so parametrized variants of one kernel spread over shards.
A shard past --timeout gets SIGINT, so pytest still prints its summary. Each shard's log goes to
DIR/shardI.txt; stdout gets one summary line per shard, then every FAILED/ERROR line and the end of
each failing shard's tracebacks (the logs may stay on a machine that is handed back). Exit status:
1 if any shard failed or timed out, else 0.

pytest-xdist would do the same but is not installed on the GPU machine (no network); this needs
nothing beyond pytest.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

# test files that run on whichever device there is, so they carry no GPU marker
BOTH_DEVICES = ("test_flex_sparse_engine.py", "test_python_api.py")


def gpu_test_files(root: Path = Path("tests")) -> list[str]:
    """Every test file with a GPU test (the conftest `gpu` skip marker or pytest.mark.gpu)."""
    return sorted(str(f) for f in root.glob("test_*.py")
                  if f.name in BOTH_DEVICES or any(m in f.read_text() for m in ("@gpu", "pytest.mark.gpu")))


def collect(files: list[str]) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                       capture_output=True, text=True)
    ids = [ln for ln in r.stdout.splitlines() if "::" in ln]
    if not ids:
        raise SystemExit(f"no tests collected from {' '.join(files)}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
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
    ap.add_argument("--out", default="out/gpu-tests")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ids = collect(a.files or gpu_test_files())
    shards = [ids[i::a.shards] for i in range(min(a.shards, len(ids)))]
    procs = []
    for i, shard in enumerate(shards):
        log = open(out / f"shard{i}.txt", "w")
        cmd = ["timeout", "-s", "INT", str(a.timeout), sys.executable, "-m", "pytest", "-q", "-rfE",
               "-p", "no:cacheprovider", *shard]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
    bad = False
    failures, details = [], []
    for i, (p, log) in enumerate(procs):
        rc = p.wait()
        log.close()
        bad |= rc not in (0, 5)
        lines = (out / f"shard{i}.txt").read_text().splitlines()
        print(f"shard{i} ({len(shards[i])} tests, rc {rc}): {lines[-1] if lines else '(no output)'}")
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
