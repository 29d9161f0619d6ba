"""tools/gpu_tests.py passes each test id as one command-line argument, which Linux caps at 128 KiB:
an id past that is refused at collection, naming the fix, instead of every shard failing with E2BIG;
tests/conftest.py names long str/bytes parameters by their length so that this repository's ids stay
short whatever pytest's version."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "gpu_tests.py"


def test_an_id_too_long_for_a_command_line_is_refused_before_any_shard(tmp_path):
    (tmp_path / "test_long.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('v', [pytest.param(1, id='x' * 140000)])\n"
        "def test_v(v):\n    assert v\n")
    r = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path / "logs"), str(tmp_path / "test_long.py")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "1 test ids are too long for a command line" in r.stderr, r.stderr[-2000:]
    assert "give that parametrization short ids" in r.stderr and not (tmp_path / "logs").exists()


def test_this_repositorys_long_parameters_get_short_ids():
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "tests/test_bench_dataset_more.py", "tests/test_chat_kwargs_json_limits.py"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    ids = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert len(ids) > 10 and max(map(len, ids)) < 400
    assert any("[row-200039-chars-nests JSON" in i for i in ids)
