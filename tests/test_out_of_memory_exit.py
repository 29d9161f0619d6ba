"""Running out of memory where no command foresaw it is one line and exit 11 (CapacityError's), not a
traceback with exit 1; and a checkpoint's side file takes memory in proportion to its size, not the
64 MiB cap. Real processes under an address-space limit (RLIMIT_AS) set a margin above what their
imports took (VmSize), so the limit holds on any machine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.errors import CapacityError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc/self/status")

ROOT = Path(__file__).resolve().parent.parent
LIMIT_ABOVE_IMPORTS = ("import resource\n{imports}\n"
                       "vm = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024\n"
                       "resource.setrlimit(resource.RLIMIT_AS, (vm + {margin}, resource.RLIM_INFINITY))\n")
CLI = "import sys\nfrom salactl.cli import main\nsys.argv = ['salactl', *sys.argv[1:]]\nmain()\n"
REPORT_IMPORTS = ("import salactl.cli, salactl.cmd_report, salactl.reports.latency, salactl.reports.atomic, "
                  "salactl.reports.records, salactl.reports.render_html, salactl.reports.render_text")


def python(code: str, *args, debug: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SALACTL_DEBUG"}
    if debug:
        env["SALACTL_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


def test_a_small_side_file_is_read_without_the_caps_memory():
    """32 MiB above the imports: reading a 2 KB config.json in one read of the 64 MiB cap was a MemoryError."""
    code = LIMIT_ABOVE_IMPORTS.format(
        imports="from pathlib import Path\nfrom salactl.errors import ConfigError\n"
                "from salactl.runtime.json_file import read_json",
        margin=32 << 20)
    code += ("print(read_json(Path('runtime/models/sala-nano/config.json'), ConfigError)['hidden_size'])")
    p = python(code)
    assert p.returncode == 0 and p.stdout.strip().isdigit(), p.stderr


@pytest.fixture(scope="module")
def big_records(tmp_path_factory) -> Path:
    """~50 MB of bench records: parsed, far more than the 128 MiB the report gets past its imports."""
    record = {"schema_version": 1, "kind": "bench", "run_id": "a-1", "label": "a", "profile": "decode",
              "phase": "S1", "target": "embedded", "model": "sala-nano",
              "timestamp": "2026-12-05T08:11:18.334674+00:00", "completed": 12, "failed": 0, "mean_ttft_ms": 10.0,
              "knobs": {"max_concurrency": 1, "input_len": 51, "output_len": 13, "dtype": "bfloat16"},
              "env": {"gpu": "NVIDIA H200", "git_sha": "0123abc", "torch": "2.11.0"}}
    path = tmp_path_factory.mktemp("records") / "records.jsonl"
    with open(path, "w") as f:
        for i in range(50_000_000 // len(json.dumps(record))):
            f.write(json.dumps({**record, "label": f"a{i}", "run_id": f"a{i}-1"}) + "\n")
    return path


def report_with_little_memory(records: Path, out: Path, debug: bool = False) -> subprocess.CompletedProcess:
    code = LIMIT_ABOVE_IMPORTS.format(imports=REPORT_IMPORTS, margin=128 << 20) + CLI
    return python(code, "report", "latency", records, "--out", out, "--json", debug=debug)


def test_running_out_of_memory_is_one_line_and_exit_11_with_no_output_left(tmp_path, big_records):
    out = tmp_path / "report"
    p = report_with_little_memory(big_records, out)
    assert p.returncode == CapacityError.exit_code, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("error: report ran out of host or GPU memory (MemoryError"), line
    assert "free memory or use smaller sizes" in line and "SALACTL_DEBUG=1" in line, line
    assert p.stdout == "" and list(tmp_path.iterdir()) == []     # no partial report, no temp file


def test_salactl_debug_still_shows_where_it_ran_out(tmp_path, big_records):
    p = report_with_little_memory(big_records, tmp_path / "report", debug=True)
    assert p.returncode == CapacityError.exit_code, p.stderr
    assert "Traceback" in p.stderr and "MemoryError" in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: report ran out of host or GPU memory"), p.stderr


def test_finalizers_memory_errors_are_held_until_main_ends_and_dropped_after_running_out():
    """An "Exception ignored" MemoryError (a generator finalized as a MemoryError's frames unwind) comes
    before the one-line error unless main holds it: reported at the end of a command that went on, and
    dropped once the command ends out of memory; other unraisables pass straight on."""
    import types

    from salactl import cli

    seen = []
    hook = cli._holding_memory_errors(seen.append)
    oom, other = (types.SimpleNamespace(exc_value=e) for e in (MemoryError(), ValueError()))
    cli._memory_errors.update(held=[], drop=False)
    try:
        hook(oom)
        hook(other)
        assert seen == [other] and cli._memory_errors["held"] == [oom]
        cli._memory_errors.update(held=[], drop=True)
        hook(oom)
        assert seen == [other] and cli._memory_errors["held"] == []
    finally:
        cli._memory_errors.update(held=[], drop=False)
