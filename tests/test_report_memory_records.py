"""`salactl report memory --records` on bench records: the settings bench writes under
knobs.target, unknown settings left unknown (no prediction), and every record predicted with its
own model's shapes, never with --model's when the record names another model."""

import json

import pytest

from conftest import run_cli
from salactl.reports import memory as mem
from salactl.reports.memory_report import MemoryQuery, build
from salactl.runtime.loader import EMBEDDED_DIR
from salactl.runtime.presets import preset

NANO = preset("sala-nano")
Q = MemoryQuery(contexts=(4096,))
REFERENCE_TARGET = {"engine": "reference", "device": "cpu", "dtype": "float32", "weights": "float32",
                    "kv_cache_dtype": "float32", "chunk_size": 512, "max_running_requests": 1,
                    "mem_fraction": None, "random_weights": False, "seed": 0}


def bench_record(max_concurrency=8, target=REFERENCE_TARGET, model=str(EMBEDDED_DIR), **top):
    """A phase record as `salactl bench --profile decode` writes it on the embedded runtime
    (salactl/bench/job.py), with an allocator peak as bench records it on CUDA."""
    return {"schema_version": 1, "kind": "bench", "run_id": "b1", "label": "b", "profile": "decode",
            "phase": "decode-bs8", "target": "embedded", "model": model, "completed": 36, "failed": 0,
            "max_concurrency": max_concurrency, "request_rate": "inf", "num_prompts": 36, "batch_size": None,
            "input_len": 51, "output_len": 13, "peak_gpu_memory_bytes": 62_000_000, **top,
            "knobs": {"max_concurrency": max_concurrency, "request_rate": "inf", "batch_size": None,
                      "dataset": {"kind": "random", "input_len": 51, "output_len": 13, "num_requests": 36},
                      "seed": None, "target": target}}


def predicted(config, batch, act_bytes=4, kv="float32", context=64, chunk=51):
    return (mem.weight_bytes(config, "bf16", 128, act_bytes).total
            + mem.prefill_workspace_bytes(config, chunk, act_bytes)
            + batch * mem.request_memory(config, context, kv, key_bytes=act_bytes).total)


def test_bench_records_take_dtype_weights_and_kv_from_knobs_target():
    (row,) = build(NANO, Q, [bench_record()], "sala-nano")["measured"]
    # the reference engine runs one request at a time, whatever max_concurrency queued
    assert (row["weights"], row["kv_dtype"], row["context"], row["batch"]) == ("fp32", "float32", 64, 1)
    assert row["predicted"] == predicted(NANO, 1)
    assert row["ratio"] == pytest.approx(62e6 / row["predicted"])


@pytest.mark.parametrize("max_concurrency, max_running, batch", [
    (8, 64, 8),          # the GPU engine: the client's limit
    (None, 64, 36),      # unlimited concurrency: at most the phase's 36 prompts
    (None, 16, 16),      # ... and at most the engine's running limit
    (None, None, None),  # unlimited, no engine limit recorded (an HTTP server): unknown, not 1
])
def test_batch_is_what_the_record_bounds_and_unknown_otherwise(max_concurrency, max_running, batch):
    target = {**REFERENCE_TARGET, "engine": "gpu", "max_running_requests": max_running}
    (row,) = build(NANO, Q, [bench_record(max_concurrency, target)], "sala-nano")["measured"]
    assert row["batch"] == batch
    assert row["predicted"] == (predicted(NANO, batch) if batch else None)


def test_an_unrecorded_kv_dtype_is_unknown_and_gets_no_prediction():
    target = {k: v for k, v in REFERENCE_TARGET.items() if k != "kv_cache_dtype"}
    (row,) = build(NANO, Q, [bench_record(target=target)], "sala-nano")["measured"]
    assert row["kv_dtype"] == "unknown" and row["weights"] == "fp32" and row["predicted"] is None
    (row,) = build(NANO, Q, [bench_record(target={})], "sala-nano")["measured"]   # an HTTP target's {}
    assert (row["weights"], row["kv_dtype"], row["predicted"]) == ("unknown", "unknown", None)


def test_a_recorded_cache_pool_is_predicted_with_all_prompts_packed_into_one_prefill_chunk():
    """A GPU record with cache_pool_bytes predicts weights + the pool + the workspace of batch x prompt tokens
    (8 x 51 = 408 of the 512-token chunk), as the GPU engine prefills its requests' prompts together."""
    target = {**REFERENCE_TARGET, "engine": "gpu", "max_running_requests": 64}
    (row,) = build(NANO, Q, [bench_record(8, target, cache_pool_bytes=1 << 30)], "sala-nano")["measured"]
    assert row["batch"] == 8 and row["cache_pool_bytes"] == 1 << 30
    assert row["predicted"] == (mem.weight_bytes(NANO, "bf16", 128, 4).total
                                + mem.prefill_workspace_bytes(NANO, 8 * 51, 4) + (1 << 30))


def measured(args, capsys):
    code, out, err = run_cli(["report", "memory", "--gpu-mem", "80", "--weights", "bf16", "--json", *args],
                             capsys)
    assert code == 0, err
    return json.loads(out)["measured"], err


def test_records_are_predicted_with_their_own_models_shapes(tmp_path, capsys):
    f = tmp_path / "records.jsonl"
    f.write_text(json.dumps(bench_record()) + "\n"
                 + json.dumps(bench_record(model="random:sala-9b:seed=0")) + "\n")
    as_9b, err = measured(["--model", "sala-9b", "--records", f], capsys)
    as_nano, _ = measured(["--model", "sala-nano", "--records", f], capsys)
    assert as_9b == as_nano and err == ""
    nano, nine = as_9b
    assert nano["model"] == str(EMBEDDED_DIR) and nano["predicted"] == predicted(NANO, 1)
    assert nine["model"] == "random:sala-9b:seed=0" and nine["predicted"] == predicted(preset("sala-9b"), 1)


def test_a_record_of_a_model_not_readable_here_gets_no_prediction_and_a_note(tmp_path, capsys):
    f = tmp_path / "records.jsonl"
    f.write_text("".join(json.dumps(bench_record(model=m, run_id=f"b{i}")) + "\n"     # not duplicates
                         for i, m in enumerate(("served-model", "served-model", str(EMBEDDED_DIR)))))
    rows, err = measured(["--model", "sala-9b", "--records", f], capsys)
    assert [r["predicted"] for r in rows] == [None, None, predicted(NANO, 1)]
    (note,) = err.strip().splitlines()
    assert note.startswith("note: 2 measured record(s) are from model 'served-model'"), note
    assert "no prediction" in note and "sala-9b" in note
