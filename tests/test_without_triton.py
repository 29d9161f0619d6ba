"""The CPU install has no Triton (CI's machine, a laptop): the main job and its checks must not import
it. Triton is hidden from a fresh interpreter (a None entry in sys.modules), so this holds here too, where the
test environment has it installed."""

import json
import subprocess
import sys

HIDE_TRITON = """
import sys
sys.modules["triton"] = None        # find_spec gives None and `import triton` raises, as uninstalled
from salactl.cli import main
sys.argv = ["salactl", *sys.argv[1:]]
main()
"""


def test_the_main_job_runs_on_cpu_without_triton(tmp_path):
    r = subprocess.run([sys.executable, "-c", HIDE_TRITON, "run", "--prompt", "def fibonacci(n):",
                        "--max-new-tokens", "4", "--device", "cpu", "--json"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(json.loads(r.stdout)["output_token_ids"]) == 4
