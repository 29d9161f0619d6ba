"""Bad inputs to run, profile, eval and sweep (the fuzz review's findings): one line, the right
exit code, and the check made before the model loads or anything large is allocated."""

import pytest

from conftest import run_cli
from salactl.errors import CapacityError, DatasetError, UsageError

HUGE = str(10**12)


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def latin1(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"caf\xe9\n")
    return path


# ---- text inputs that are not UTF-8, and empty paths ------------------------------------------

def test_run_prompt_file_not_utf8_is_a_dataset_error(latin1, capsys):
    code, out, err = run_cli(["run", "--prompt-file", latin1, "-n", "1"], capsys)
    assert code == DatasetError.exit_code == 7
    assert "--prompt-file" in err and "is not UTF-8 text (invalid continuation byte at byte offset 3)" in _one_error_line(err)


def test_eval_ppl_file_not_utf8_says_so_as_bench_does(latin1, capsys):
    code, _, err = run_cli(["eval", "ppl", "--file", latin1], capsys)
    assert code == 7 and "--file" in err and "is not UTF-8 text (invalid continuation byte at byte offset 3)" in _one_error_line(err)


@pytest.mark.parametrize("args, flag", [
    (["run", "--prompt-file", "", "-n", "1"], "--prompt-file"),
    (["eval", "ppl", "--file", ""], "--file"),
    (["profile", "--import", ""], "--import"),
])
def test_empty_path_is_named_empty_not_dot(args, flag, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == UsageError.exit_code
    assert _one_error_line(err).startswith(f"error: {flag} is empty; give ")


@pytest.mark.parametrize("args", [
    ["run", "--prompt", "hi", "-n", "1", "--out", ""],
    ["run", "--prompt", "hi", "-n", "1", "--out="],
    ["profile", "--torch", "-o", ""],
])
def test_empty_out_is_refused(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(args, capsys)
    assert code == 2 and _one_error_line(err) == "error: --out is empty; give a directory"
    assert not any(tmp_path.iterdir())


def test_out_dot_still_means_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["run", "--prompt-ids", "1,2", "-n", "1", "--json", "--out", "."], capsys)
    assert code == 0, err
    assert (tmp_path / "records.jsonl").is_file()


def test_empty_model_is_a_usage_error_not_sala_nano(capsys):
    code, _, err = run_cli(["run", "--prompt", "hi", "-n", "1", "--model", ""], capsys)
    assert code == 2 and "model (--model) is empty" in _one_error_line(err)


def test_load_model_refuses_an_empty_name():
    from salactl.runtime.loader import load_model

    with pytest.raises(UsageError, match="is empty"):
        load_model("")


# ---- sizes past memory: exit 11 before allocating; counts without bound -----------------------

@pytest.mark.parametrize("args, fix", [
    (["--context", HUGE], "use a smaller --context (at most about"),
    (["--batch", HUGE], "use a smaller --batch (at most"),
])
def test_profile_size_past_memory_is_a_capacity_error(args, fix, tmp_path, capsys):
    out = tmp_path / "p"
    # the CPU engine's wording: on a GPU machine profile would pick the GPU engine, which says "GPU engine's caches"
    code, _, err = run_cli(["profile", "--torch", "--device", "cpu", "--phase", "decode", "--warmup", "0",
                            "--out", out, *args], capsys)
    line = _one_error_line(err)
    assert code == CapacityError.exit_code == 11
    assert "for the caches" in line and "available" in line and fix in line
    assert "profiling" not in err and not out.exists()


def test_profile_warmup_has_an_upper_bound(capsys):
    code, _, err = run_cli(["profile", "--torch", "--warmup", HUGE], capsys)
    assert code == 2 and "--warmup must be in 0..100" in _one_error_line(err)


@pytest.mark.parametrize("args", [["--lengths", HUGE, "--depths", "0.5", "--trials", "1"], ["--trials", HUGE]])
def test_eval_passkey_past_memory_is_refused_before_building_prompts(args, capsys):
    code, _, err = run_cli(["eval", "passkey", *args], capsys)
    line = _one_error_line(err)
    assert code == 11 and "available" in line and "--lengths" in line and "--trials" in line


# ---- options that would be ignored, and --top -----------------------------------------------

@pytest.mark.parametrize("args, named", [
    (["--ncu-path", "/nonexistent/ncu"], "--ncu-path applies"),
    (["--launch-skip", HUGE, "--launch-count", HUGE], "--launch-skip, --launch-count apply"),
    (["--ncu-metrics", "sol"], "--ncu-metrics applies"),
    (["--ncu-metrics", "bytes", "--launch-skip", "0"], "--launch-skip, --ncu-metrics apply"),   # their defaults
])
def test_profile_ncu_options_are_refused_with_torch(args, named, tmp_path, capsys):
    code, _, err = run_cli(["profile", "--torch", "--out", tmp_path / "p", *args], capsys)
    line = _one_error_line(err)
    assert code == 2 and named in line and "--torch runs torch.profiler: drop" in line and "use --ncu" in line
    assert not (tmp_path / "p").exists()


def test_profile_ncu_options_are_refused_where_auto_mode_runs_torch(tmp_path, capsys):
    code, _, err = run_cli(["profile", "--device", "cpu", "--ncu-metrics", "bytes", "--out", tmp_path / "p"], capsys)
    line = _one_error_line(err)
    assert code == 2 and "--ncu-metrics applies to Nsight Compute profiles only; auto mode runs torch.profiler " \
                         "here (no CUDA GPU, or --device cpu)" in line
    assert not (tmp_path / "p").exists()


def _fake_ncu(tmp_path) -> str:
    ncu = tmp_path / "ncu"
    ncu.write_text("#!/bin/sh\n")
    ncu.chmod(0o755)
    return str(ncu)


def test_auto_mode_takes_ncu_options_where_it_runs_ncu(tmp_path, monkeypatch):
    """On a GPU where ncu is found auto mode runs Nsight Compute, so its options apply; where ncu is
    not found it would run torch.profiler and they are refused; an --ncu-path naming nothing is the
    missing tool's error, not a fallback."""
    from salactl.errors import ToolMissingError
    from salactl.profiling.ncu_runner import find_ncu
    from salactl.profiling.session import pick_mode

    given = ("--launch-count", "--ncu-metrics")
    assert pick_mode("auto", True, _fake_ncu(tmp_path), given) == "ncu"
    assert pick_mode("ncu", True, _fake_ncu(tmp_path), given) == "ncu"
    with pytest.raises(ToolMissingError, match="--ncu-path .* is not an executable file"):
        pick_mode("auto", True, str(tmp_path / "none"), ("--ncu-path",))
    monkeypatch.setenv("SALACTL_NCU", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    try:
        find_ncu(None)
        pytest.skip("ncu is installed in a searched place")
    except ToolMissingError:
        pass
    with pytest.raises(UsageError, match="^--launch-count, --ncu-metrics apply to Nsight Compute profiles only; "
                                         "auto mode runs torch.profiler here, as ncu was not found: drop them"):
        pick_mode("auto", True, None, given)
    assert pick_mode("auto", True, None, ()) == "torch"      # nothing asked for ncu: the warned fallback


def test_eval_ppl_split_with_file_is_refused(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("hello world\n")
    code, _, err = run_cli(["eval", "ppl", "--file", text, "--split", "train"], capsys)
    assert code == 2 and "--split" in _one_error_line(err) and "--file" in err


@pytest.mark.parametrize("top", ["0", "-1"])
def test_profile_top_must_be_positive(top, tmp_path, capsys):
    code, _, err = run_cli(["profile", "--torch", "--top", top, "--out", tmp_path / "p"], capsys)
    assert code == 2 and f"--top must be >= 1 (kernel rows to show), got {top}" in _one_error_line(err)
    assert not (tmp_path / "p").exists()


# ---- messages and their order ---------------------------------------------------------------

def test_profile_import_of_a_file_says_it_is_a_file(tmp_path, capsys):
    f = tmp_path / "empty.txt"
    f.write_text("")
    code, _, err = run_cli(["profile", "--import", f], capsys)
    assert code == 2 and "is a file, not a directory" in _one_error_line(err)


def test_sweep_window_no_block_takes_is_a_usage_error_before_loading(tmp_path, capsys):
    code, _, err = run_cli(["sweep", "--device", "cpu", "--window", "3", "--input-len", "24", "--output-len", "2",
                            "--requests", "1", "--no-kl", "--no-passkey", "--out", tmp_path / "s"], capsys)
    assert code == UsageError.exit_code and not (tmp_path / "s").exists()
    assert _one_error_line(err) == "error: --window 3 is not a multiple of the block size 32; use a multiple of 32"


def test_run_sampling_checks_come_before_the_model_loads(tmp_path, capsys):
    """A missing model would be exit 4 (checkpoint); the sampling flag's error comes first."""
    for flag, value in (("--top-k", "-1"), ("--temperature", "-1"), ("--max-new-tokens", "-1")):
        code, _, err = run_cli(["run", "--prompt", "hi", "--model", tmp_path / "missing", flag, value], capsys)
        assert code == 2 and flag in _one_error_line(err)


@pytest.mark.parametrize("args, code", [
    (["--device", "bogus"], 2), (["--dtype", "bogus"], 2), (["--model", "missing-model"], 4),
    (["--layers", "99"], 2), (["--backend", "engine"], 6),      # no GPU: a device error, as bench --engine gpu
])
def test_profile_checks_before_saying_profiling(args, code, tmp_path, capsys):
    import torch

    if args[0] == "--backend" and torch.cuda.is_available():
        pytest.skip("the GPU engine may be usable here")
    rc, _, err = run_cli(["profile", "--torch", "--out", tmp_path / "p", *args], capsys)
    assert rc == code
    _one_error_line(err)
    assert "profiling" not in err


def test_profile_suggests_a_context_its_own_count_admits_with_the_selection_temporaries():
    """The suggested --context fits by the check's own count, which holds the reference selection's
    window scores of a prefill chunk (they outgrow the KV cache at long context on sala-nano)."""
    import dataclasses

    from salactl.profiling.preflight import _fixes, reference_attention_bytes, step_memory_bytes
    from salactl.profiling.spec import ProfileSpec
    from salactl.runtime.loader import model_config

    config = model_config("sala-nano")
    spec = ProfileSpec(phases=("prefill",), context=10**8)
    kv_only = step_memory_bytes(spec, config, 4, False, reference=False)[0]
    assert reference_attention_bytes(spec, config) > kv_only > 0
    avail = 3 << 30
    message = _fixes(spec, config, 4, False, True, avail)
    context = int(message.split("at most about ")[1].split(" tokens")[0].replace(",", ""))
    need = lambda c: sum(step_memory_bytes(dataclasses.replace(spec, context=c), config, 4, False))  # noqa: E731
    assert need(context) <= avail < need(context + 1)


def test_profile_counts_the_reference_engines_dense_attention_scores():
    """A prefill chunk below dense_len scores every cached key in fp32 (3 copies, as the sweep and
    eval checks count): 60,000 dense rows over 60,000 keys are ~346 GB of scores on sala-nano's heads."""
    import dataclasses

    from salactl.bench.sweep_sizes import SCORE_COPIES
    from salactl.profiling.preflight import step_memory_bytes
    from salactl.profiling.spec import ProfileSpec
    from salactl.runtime.loader import model_config

    nano = model_config("sala-nano")
    dense = dataclasses.replace(nano, sparse_config=dataclasses.replace(nano.sparse_config, dense_len=1 << 20))
    spec = ProfileSpec(phases=("prefill",), context=60_000, chunk_size=60_000)
    scores = SCORE_COPIES * 4 * nano.num_attention_heads * (60_000 - 0) * 60_000
    with_scores = step_memory_bytes(spec, dense, 4, False)[0]
    assert with_scores >= scores > step_memory_bytes(spec, dense, 4, False, reference=False)[0]
