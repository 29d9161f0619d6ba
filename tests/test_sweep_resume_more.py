"""`salactl sweep` at its edges: a point whose requests fail (fp16 NaN logits in the warmup) is listed
under invalid_points while the sweep goes on; --resume names reused points as this sweep names them
and marks the front by point_key, re-measures points whose record lacks what it reads or that ran
with another tokenizer, reads a records file with a byte-order mark and refuses one that is no
regular file; the sweep warns past the trained length, refuses too short passkey lengths before any
measurement and labels with control characters (run's too)."""

import json
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest
from safetensors.torch import load_file, save_file

from conftest import run_cli
from test_report_records_more import salactl_with_memory_limit
from salactl.bench.records import check_label, read_records
from salactl.bench.sweep_job import SweepSettings, run_sweep
from salactl.errors import UsageError
from salactl.runtime.loader import EMBEDDED_DIR

FAST = dict(device="cpu", input_len=16, output_len=2, requests=1)


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def checkpoint_copy(tmp_path, norm_factor=None, **config) -> str:
    """The embedded sala-nano checkpoint copied, its final norm scaled by `norm_factor` (1e5: past
    float16's range, so that a float16 cast computes NaN/Inf logits while fp32 and bf16 do not) and
    `config` set in its config.json."""
    out = tmp_path / "model"
    shutil.copytree(EMBEDDED_DIR, out)
    if norm_factor is not None:
        shard = out / json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]["model.norm.weight"]
        sd = load_file(shard)
        sd["model.norm.weight"] = sd["model.norm.weight"] * norm_factor
        save_file(sd, shard, metadata={"format": "pt"})
    if config:
        cfg = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**cfg, **config}))
    return str(out)


# ---------------------------------------------------------------- a point whose requests fail
def test_a_point_with_nan_logits_is_an_invalid_point_and_the_sweep_goes_on(tmp_path):
    model = checkpoint_copy(tmp_path, norm_factor=1e5)
    r = salactl("sweep", "--model", model, "--device", "cpu", "--requests", 2, "--input-len", 16, "--output-len", 4,
                "--weight-dtype", "fp32,fp16,bf16", "--no-passkey", "--out", tmp_path / "o", "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert [p["phase"] for p in run["points"]] == ["wtfp32", "wtbf16"]
    (invalid,) = run["invalid_points"]
    assert invalid["knobs"]["weight_dtype"] == "fp16" and "NaN/Inf logits" in invalid["reason"]
    assert "warning: skipping point wtfp16: the warmup request of phase wtfp16 failed" in r.stderr
    assert len((tmp_path / "o" / "records.jsonl").read_text().splitlines()) == 2


def test_a_sweep_whose_every_point_fails_keeps_the_errors_exit_code(tmp_path):
    model = checkpoint_copy(tmp_path, norm_factor=1e5)
    r = salactl("sweep", "--model", model, "--device", "cpu", "--requests", 1, "--input-len", 16, "--output-len", 2,
                "--weight-dtype", "fp16", "--no-passkey", "--out", tmp_path / "o")
    assert r.returncode == 15, r.stderr                         # NumericsError, as bench's
    assert r.stderr.strip().splitlines()[-1].startswith("error: the warmup request of phase default failed")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------- --resume: names and the front
def starred(stdout: str) -> list[str]:
    """The points the table marks in its front column."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in stdout.splitlines() if line.startswith("│")]
    return [row[0] for row in rows if row[-1] == "*"]


def test_resumed_points_take_this_sweeps_names_and_the_front_is_marked_by_point_key(tmp_path):
    common = ("--label", "B", "--topk", "1,3", "--input-len", 160, "--window", 32, "--no-passkey", "--device", "cpu",
              "--requests", 1, "--output-len", 2, "--out", tmp_path)
    assert salactl("sweep", *common, "--dense-len", 16).returncode == 0
    assert salactl("sweep", *common, "--dense-len", 96, "--resume").returncode == 0
    r = salactl("sweep", *common, "--dense-len", "16,96", "--resume")
    assert r.returncode == 0, r.stderr
    run_id = re.search(r"sweep (\S+-\S+)", r.stdout).group(1)
    summary = json.loads((tmp_path / f"{run_id}-sweep.json").read_text())
    names = [p["phase"] for p in summary["points"]]
    assert summary["resumed_points"] == 4
    assert names == ["dl16-tk1", "dl16-tk3", "dl96-tk1", "dl96-tk3"]          # unique, as this sweep names them
    keys = {p["point_key"]: p["phase"] for p in summary["points"]}
    assert [keys[k] for k in summary["pareto_point_keys"]] == summary["pareto"]
    assert sorted(starred(r.stdout)) == sorted(summary["pareto"])


# ---------------------------------------------------------------- --resume: records it cannot reuse
@pytest.fixture(scope="module")
def passkey_sweep(tmp_path_factory):
    """One point measured with the passkey: (its settings, records.jsonl's text)."""
    out = tmp_path_factory.mktemp("pk")
    settings = dict(FAST, kl=False, passkey_lengths="64", passkey_depths="0.5", passkey_trials=1)
    run = run_sweep(SweepSettings(**settings, out=out)).to_dict()
    assert run["points"][0]["passkey_results"][0]["length"] == 64
    return settings, (out / "records.jsonl").read_text()


def drop(record: dict, path: str) -> dict:
    record = json.loads(json.dumps(record))
    *parents, last = path.split(".")
    node = record
    for p in parents:
        node = node[p][0] if p == "passkey_results" else node[p]
    del node[last]
    return record


@pytest.mark.parametrize("field", ["knobs.dense_len", "knobs.input_len", "knobs.output_len",
                                   "passkey_results.length"])
def test_a_record_lacking_what_resume_reads_is_measured_again_with_a_note(tmp_path, capsys, passkey_sweep, field):
    settings, text = passkey_sweep
    (record,) = map(json.loads, text.splitlines())
    (tmp_path / "records.jsonl").write_text(json.dumps(drop(record, field)) + "\n")
    run = run_sweep(SweepSettings(**settings, out=tmp_path, resume=True)).to_dict()
    assert run["resumed_points"] == 0 and len(run["points"]) == 1
    short = field.replace("passkey_results.", "passkey_results[].")
    assert f"note: the record of point default in {tmp_path / 'records.jsonl'} lacks {short}" in capsys.readouterr().err


def test_a_record_without_a_phase_is_reused_under_this_sweeps_name(tmp_path, passkey_sweep):
    settings, text = passkey_sweep
    (record,) = map(json.loads, text.splitlines())
    (tmp_path / "records.jsonl").write_text(json.dumps(drop(record, "phase")) + "\n")
    run = run_sweep(SweepSettings(**settings, out=tmp_path, resume=True)).to_dict()
    assert run["resumed_points"] == 1 and run["points"][0]["phase"] == "default"


def test_a_records_file_with_a_byte_order_mark_is_resumed_from_its_first_line(tmp_path, capsys, passkey_sweep):
    settings, text = passkey_sweep
    (tmp_path / "records.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    run = run_sweep(SweepSettings(**settings, out=tmp_path, resume=True)).to_dict()
    assert run["resumed_points"] == 1
    assert "damaged" not in capsys.readouterr().err


# ---------------------------------------------------------------- --resume: what the prompts are made of
def tokenizer_copy(tmp_path, **config) -> str:
    """The embedded tokenizer in a directory of its own, `config` set in its tokenizer_config.json."""
    out = tmp_path / "tok"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (EMBEDDED_DIR / name).exists():
            shutil.copy(EMBEDDED_DIR / name, out / name)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**cfg, **config}))
    return str(out)


def test_resume_measures_again_what_another_tokenizer_prompted(tmp_path):
    settings = dict(FAST, kl_len=96, passkey=False, out=tmp_path / "o")
    first = run_sweep(SweepSettings(**settings)).to_dict()
    knobs = first["points"][0]["knobs"]
    assert knobs["kl_prompt"] == "text" and knobs["tokenizer_sha256"]
    assert run_sweep(SweepSettings(**settings, resume=True)).to_dict()["resumed_points"] == 1
    other = tokenizer_copy(tmp_path, add_bos_token=False)          # other ids for the same KL text
    run = run_sweep(SweepSettings(**settings, tokenizer=other, resume=True)).to_dict()
    assert run["resumed_points"] == 0
    assert run["points"][0]["knobs"]["tokenizer_sha256"] != knobs["tokenizer_sha256"]


def test_a_kl_prompt_too_short_for_text_is_recorded_as_random_ids(tmp_path):
    run = run_sweep(SweepSettings(**FAST, kl_len=16, passkey=False, out=tmp_path)).to_dict()
    assert run["points"][0]["knobs"]["kl_prompt"] == "random"


# ---------------------------------------------------------------- checks before measuring
def test_sweep_warns_past_the_trained_length_of_its_longest_sequence(tmp_path):
    model = checkpoint_copy(tmp_path, max_position_embeddings=64)
    r = salactl("sweep", "--model", model, "--device", "cpu", "--requests", 1, "--input-len", 16, "--output-len", 2,
                "--kl-len", 80, "--no-passkey", "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    assert ("warning: --kl-len is 80 tokens, past the model's max_position_embeddings (64); it runs, but "
            "quality beyond the trained length is not guaranteed") in r.stderr


def test_too_short_passkey_lengths_are_refused_before_any_point_is_measured(tmp_path):
    class Progress:
        began = False

        def begin(self, name, total):
            Progress.began = True

        def advance_point(self): ...

        def end(self): ...

    with pytest.raises(UsageError, match="^--passkey-lengths: passkey length 8 is too short; the prompt needs at "
                                         "least \\d+ tokens$"):
        run_sweep(SweepSettings(**FAST, kl=False, topk="1,2", passkey_lengths="8", out=tmp_path / "o"), Progress())
    assert not Progress.began and not (tmp_path / "o").exists()


@pytest.mark.parametrize("label", ["a\nb", "x\x1by", "tab\there", "line\u2028sep"])
def test_labels_with_control_characters_are_refused_by_sweep_run_and_bench(tmp_path, capsys, label):
    with pytest.raises(UsageError, match="--label .* holds the control character"):
        check_label(label)
    for cmd in (["sweep", *("--device", "cpu", "--no-kl", "--no-passkey")],
                ["run", "--prompt-ids", "1,2", "-n", 1, "--device", "cpu"],
                ["bench", "--phases", "S1", "--scale", "0.001", "--device", "cpu"]):
        code, out, err = run_cli([*cmd, "--label", label, "--out", tmp_path / "o"], capsys)
        assert code == UsageError.exit_code and out == "", err
        (line,) = err.strip().splitlines()
        assert line.startswith("error: --label ") and "control character" in line
    assert not (tmp_path / "o").exists()
    assert check_label("B é|x") == "B é|x" and check_label(None) is None


# ---------------------------------------------------------------- records.jsonl that is no regular file
def test_resume_refuses_a_records_file_in_out_that_is_dev_zero(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "records.jsonl").symlink_to("/dev/zero")
    r = salactl_with_memory_limit("sweep", "--device", "cpu", "--no-kl", "--no-passkey", "--resume", "--out",
                                  tmp_path / "o")
    assert r.returncode == UsageError.exit_code, r.stderr
    assert r.stderr.strip() == (f"error: records file {tmp_path / 'o' / 'records.jsonl'} is not a regular file (a "
                                "device, FIFO or socket); move it away or choose another --out")


def test_read_records_refuses_a_fifo_instead_of_waiting_for_a_writer(tmp_path):
    """(sweep's own --out check already refuses a FIFO without a reader; read_records is the API's guard)"""
    path = tmp_path / "records.jsonl"
    os.mkfifo(path)
    box = []

    def read():
        try:
            box.append(read_records(path))
        except UsageError as e:
            box.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        with open(path, "wb"):         # let the blocked open go
            pass
        t.join(10)
        pytest.fail("read_records waited for a writer to the FIFO")
    assert str(box[0]) == (f"records file {path} is not a regular file (a device, FIFO or socket); move it away "
                           "or choose another --out")
