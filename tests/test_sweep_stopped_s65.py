"""A sweep that an error ends before its last point (here its records file reaching the file-size
limit, as on a full disk) says so in the summary it writes on the way out: why (`stopped`) and at
which point (`stopped_at`), `interrupted` staying for Ctrl-C; --resume then measures only the rest."""

import json
import resource
import subprocess
import sys

from salactl.bench.sweep_job import SweepSettings, run_sweep

FAST = dict(device="cpu", input_len=8, output_len=2, requests=1, kl=False, passkey=False)


def test_a_sweep_stopped_by_an_error_says_why_and_where_and_resumes(tmp_path):
    run_sweep(SweepSettings(**FAST, topk="1", out=tmp_path / "one"))
    record_bytes = (tmp_path / "one" / "records.jsonl").stat().st_size
    out = tmp_path / "o"
    out.mkdir()
    records = out / "records.jsonl"
    records.write_text(json.dumps({"kind": "run", "pad": "x" * 2**18}) + "\n")   # a run's record before it
    limit = records.stat().st_size + record_bytes * 3 // 2          # room for the first point's record only

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    args = ["sweep", "--device", "cpu", "--input-len", 8, "--output-len", 2, "--requests", 1, "--no-kl",
            "--no-passkey", "--topk", "1,2", "--out", out]
    r = subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                       timeout=300, preexec_fn=cap)
    assert r.returncode == 16, r.stderr
    (summary_path,) = out.glob("*-sweep.json")
    summary = json.loads(summary_path.read_text())
    assert [p["phase"] for p in summary["points"]] == ["tk1"] and summary["interrupted"] is False
    assert summary["stopped_at"] == "tk2"
    assert summary["stopped"].startswith(f"cannot append to {records}: File too large")
    assert summary["stopped"] in r.stderr

    rest = run_sweep(SweepSettings(**FAST, topk="1,2", out=out, resume=True)).to_dict()
    assert rest["resumed_points"] == 1 and [p["phase"] for p in rest["points"]] == ["tk1", "tk2"]
    assert "stopped" not in rest and "stopped_at" not in rest and rest["interrupted"] is False
    assert len(records.read_text().splitlines()) == 3
