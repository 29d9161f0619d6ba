"""`salactl profile --weights bf16` loads the model in bfloat16, as sweep's does (a --dtype that
disagrees is refused); --weights auto records the dtype that ran, not "bf16"; and a --chunk-size past
--context is recorded as the chunk that ran, as run and bench clamp it."""

import json

import pytest

from conftest import run_cli
from salactl.errors import UsageError
from salactl.profiling.spec import ProfileSpec

PROFILE = ("profile", "--torch", "--random-weights", "--device", "cpu", "--warmup", 0)
DECODE = (*PROFILE, "--phase", "decode", "--context", 16)


def profile_json(args, tmp_path, capsys) -> dict:
    code, out, err = run_cli([*args, "--out", tmp_path / "p", "--json"], capsys)
    assert code == 0, err
    return json.loads(out)["manifest"]


@pytest.mark.parametrize("extra", [(), ("--dtype", "bfloat16"), ("--dtype", "bf16")])
def test_bf16_weights_load_the_model_in_bfloat16(tmp_path, capsys, extra):
    m = profile_json([*DECODE, "--weights", "bf16", *extra], tmp_path, capsys)
    assert (m["weights"], m["dtype"], m["kv_dtype"]) == ("bfloat16", "bfloat16", "bfloat16")
    assert (m["spec"]["weights"], m["spec"]["dtype"]) == ("bf16", "bf16")


def test_auto_weights_record_the_dtype_that_ran(tmp_path, capsys):
    m = profile_json(DECODE, tmp_path, capsys)          # CPU: --dtype auto is float32
    assert (m["weights"], m["spec"]["weights"], m["spec"]["dtype"]) == ("float32", "fp32", "fp32")
    assert ProfileSpec(random_weights=True, dtype="float16").with_checkpoint_weights().weights == "fp16"


def test_the_text_header_names_the_weights_that_ran(tmp_path, capsys):
    code, out, err = run_cli([*DECODE, "--weights", "bf16", "--out", tmp_path / "p"], capsys)
    assert code == 0, err
    assert "(bfloat16, KV bfloat16, weights bfloat16)" in out


@pytest.mark.parametrize("weights, dtype", [("bf16", "float32"), ("fp32", "bf16"), ("fp16", "bfloat16")])
def test_a_dtype_that_disagrees_with_the_weights_is_refused(tmp_path, capsys, weights, dtype):
    code, out, err = run_cli([*DECODE, "--weights", weights, "--dtype", dtype, "--out", tmp_path / "p"], capsys)
    assert code == UsageError.exit_code == 2 and out == ""
    assert err.strip().splitlines() == [f"error: --weights {weights} loads the model in "
                                        f"{dict(bf16='bfloat16', fp16='float16', fp32='float32')[weights]} "
                                        f"but --dtype is {dtype}; drop --dtype or --weights"]
    assert not (tmp_path / "p").exists()


def test_fp16_and_fp32_weights_are_casts_and_others_are_listed():
    for weights, dtype in (("fp16", "auto"), ("fp32", "float32")):
        spec = ProfileSpec(random_weights=True, weights=weights, dtype=dtype).with_checkpoint_weights()
        assert (spec.weights, spec.dtype) == (weights, weights)
    with pytest.raises(UsageError, match=r"valid: auto, bf16, fp16, fp32, w4a16, w8a16$"):
        ProfileSpec(weights="bfloat16")


def test_a_chunk_past_the_context_records_the_chunk_that_ran(tmp_path, capsys):
    m = profile_json([*PROFILE, "--phase", "prefill", "--context", 16, "--chunk-size", 1000], tmp_path, capsys)
    assert m["spec"]["chunk_size"] == 16
    assert (m["steps"]["prefill"]["new_tokens"], m["steps"]["prefill"]["cached_tokens"]) == (16, 0)
    assert ProfileSpec(context=128, chunk_size=64).chunk_size == 64
