"""tools/train_nano.py runs end to end on CPU (two tiny steps) and writes a checkpoint the runtime loads."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from salactl.runtime.loader import load_model

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_train_nano_smoke_writes_a_loadable_sharded_checkpoint(tmp_path):
    out, log = tmp_path / "nano", tmp_path / "log.jsonl"
    r = subprocess.run(
        [sys.executable, str(REPO / "tools" / "train_nano.py"), "--out", str(out), "--device", "cpu",
         "--steps", "2", "--warmup", "1", "--batch-tokens", "256", "--lengths", "128",
         "--eval-every", "0", "--eval-lengths", "128", "--eval-trials", "1", "--log", str(log)],
        capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    kinds = [x["kind"] for x in records]
    assert kinds[0] == "config" and kinds.count("train") == 2 and "saved" in kinds and "final_eval" in kinds
    config = records[0]
    assert config["args"]["seed"] == 0 and len(config["corpus_train_sha256"]) == 64
    assert (out / "model.safetensors.index.json").exists() and (out / "generation_config.json").exists()
    lm = load_model(str(out), "cpu", "float32")
    assert lm.config.vocab_size == 4096
    assert json.loads((out / "config.json").read_text())["salactl_training"]["steps"] == 2
