"""Bad input the fuzz review found (non-UTF-8 text, sizes that cannot fit, blank URLs, options that
would be ignored): one line on stderr with its own exit code, never a traceback, nothing allocated."""

import os
import subprocess
import sys

import pytest

from conftest import run_cli

LATIN1 = b"caf\xe9 au lait\n"


def one_line_error(code, err, expected_code, *words):
    assert code == expected_code, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


SETPRIV = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def run_unprivileged(args):
    """`salactl ARGS` in a subprocess that chmod 000 blocks (root too, through setpriv); None when
    this machine cannot make one."""
    prefix = SETPRIV if os.geteuid() == 0 else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SALACTL_DEBUG", None)
    try:
        return subprocess.run([*prefix, sys.executable, "-m", "salactl", *map(str, args)], capture_output=True,
                              text=True, timeout=300, env=env)
    except FileNotFoundError:
        return None


def unreadable_run(path, args):
    path.chmod(0)
    r = run_unprivileged(args)
    if r is None or "Operation not permitted" in r.stderr and "setpriv" in r.stderr:
        pytest.skip("cannot drop the permission to read chmod 000 files here")
    return r


# ---------------------------------------------------------------- text that is not UTF-8
def test_non_utf8_profile_file_exits_3(tmp_path, capsys):
    (tmp_path / "p.toml").write_bytes(LATIN1)
    code, out, err = run_cli(["bench", "--profile", tmp_path / "p.toml", "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 3, "--profile", "is not UTF-8 text")


def test_non_utf8_records_on_sweep_resume_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "records.jsonl").write_bytes(b'{"kind": "sweep"}\n' + LATIN1)
    code, out, err = run_cli(["sweep", "--dense-len", "64", "--topk", "2", "--input-len", "32", "--output-len", "2",
                              "--requests", "1", "--no-passkey", "--out", tmp_path / "o", "--resume"], capsys)
    one_line_error(code, err, 2, "records.jsonl:2 is not UTF-8 text", "--out")


def test_calib_file_that_is_not_utf8_exits_7(tmp_path, capsys):
    (tmp_path / "c.txt").write_bytes(LATIN1 * 50)
    for method in ("gptq", "rtn"):
        code, out, err = run_cli(["quantize", "--out", tmp_path / "q", "--method", method, "--nsamples", "1",
                                  "--seqlen", "16", "--calib", tmp_path / "c.txt"], capsys)
        one_line_error(code, err, 7, "--calib", "is not UTF-8 text")
        assert not (tmp_path / "q").exists()


def test_prompt_with_bytes_that_are_not_utf8_is_a_usage_error_from_the_tokenizer():
    from salactl.errors import UsageError
    from salactl.runtime.loader import EMBEDDED_DIR
    from salactl.runtime.tokenizer import Tokenizer

    tok = Tokenizer(EMBEDDED_DIR)
    text = b"caf\xe9".decode("utf-8", "surrogateescape")      # how Python hands over such argv bytes
    with pytest.raises(UsageError, match=r"not valid UTF-8 \(byte 0xe9 at character offset 3\)"):
        tok.encode(text)
    assert tok.encode("café") == tok.encode("café")


@pytest.mark.skipif(sys.platform != "linux", reason="argv bytes that are not UTF-8 need a POSIX locale")
def test_run_prompt_with_a_latin1_byte_exits_2():
    env = dict(os.environ, OMP_NUM_THREADS="1", LC_ALL="C.UTF-8")
    env.pop("SALACTL_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "salactl", "run", "--prompt", b"caf\xe9", "-n", "1"],
                       capture_output=True, text=True, timeout=300, env=env)
    one_line_error(r.returncode, r.stderr, 2, "not valid UTF-8")


# ---------------------------------------------------------------- sizes that cannot fit
@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads Linux's MemAvailable")
def test_bench_scale_past_host_memory_is_a_capacity_error(tmp_path, capsys):
    code, out, err = run_cli(["bench", "--scale", "1e6", "--num-requests", "1", "--phases", "S1",
                              "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 11, "but this machine has", "lower --scale")
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads Linux's MemAvailable")
@pytest.mark.parametrize("flag, fix", [("--requests", "lower --requests"), ("--input-len", "lower --requests or --input-len"),
                                       ("--output-len", "lower --input-len/--output-len"), ("--kl-len", "lower --kl-len")])
def test_sweep_sizes_past_host_memory_are_refused_before_loading(flag, fix, tmp_path, capsys):
    args = {"--dense-len": "64", "--topk": "2", "--input-len": "32", "--output-len": "2", "--requests": "1",
            flag: str(10**12)}
    code, out, err = run_cli(["sweep", *[x for kv in args.items() for x in kv], "--no-passkey", "--device", "cpu",
                              "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 11, "but this machine has", fix)
    assert not (tmp_path / "o").exists()


def test_kl_prompt_lets_memory_errors_through():
    from salactl.bench.accuracy import kl_prompt

    class OutOfMemoryTokenizer:
        prefix_ids = ()

        def encode(self, text, add_special_tokens=True):
            raise MemoryError

    with pytest.raises(MemoryError):
        kl_prompt(OutOfMemoryTokenizer(), 64, 4096, 0)


# ---------------------------------------------------------------- endpoints, profiles, datasets
@pytest.mark.parametrize("url", ["http:// ", "http://local host:1", "http://a\tb:1"])
def test_endpoint_with_blanks_is_the_usual_url_error(url, tmp_path, capsys):
    code, out, err = run_cli(["bench", "--endpoint", url, "--scale", "0.002", "--num-requests", "1",
                              "--phases", "S1", "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 2, "--endpoint must be an http(s) URL")


def test_profile_that_is_a_directory_says_so(tmp_path, capsys):
    code, out, err = run_cli(["bench", "--profile", tmp_path, "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 3, "--profile", "is a directory")
    assert "does not exist" not in err


def test_unreadable_profile_exits_3_naming_the_flag(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text('name = "x"\n')
    r = unreadable_run(path, ["bench", "--profile", path, "--out", tmp_path / "o"])
    one_line_error(r.returncode, r.stderr, 3, "cannot read --profile", "Permission denied")


def test_empty_profile_is_refused(tmp_path, capsys):
    code, out, err = run_cli(["bench", "--profile", "", "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 2, "--profile is empty")


def test_dataset_for_an_unknown_phase_names_the_phase(tmp_path, capsys):
    code, out, err = run_cli(["bench", "--dataset", "S1=a.jsonl,S9=x.jsonl", "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 2, "phase 'S9'", "S1, S8, Smax")


def test_a_missing_dataset_whose_name_holds_an_equals_sign_says_both_readings(tmp_path, capsys):
    code, out, err = run_cli(["bench", "--dataset", "data=v2.jsonl", "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 7, "dataset data=v2.jsonl does not exist", "'data' is not a phase", "S1, S8, Smax")


def test_dataset_file_whose_name_holds_an_equals_sign_is_still_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "S9=x.jsonl").write_text("")
    code, out, err = run_cli(["bench", "--dataset", "S9=x.jsonl", "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 7, "S9=x.jsonl has no usable rows")


# ---------------------------------------------------------------- options that would be ignored
@pytest.mark.parametrize("phases", ["", ",", " , "])
def test_bench_phases_that_name_nothing_are_refused(phases, tmp_path, capsys):
    code, out, err = run_cli(["bench", "--phases", phases, "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 2, "--phases", "names no phase")


def test_bench_tokenizer_without_dataset_on_the_embedded_runtime_is_refused(tmp_path, capsys):
    code, out, err = run_cli(["bench", "--tokenizer", tmp_path / "missing", "--scale", "0.002", "--num-requests", "1",
                              "--phases", "S1", "--out", tmp_path / "o"], capsys)
    one_line_error(code, err, 2, "--tokenizer applies to --dataset", "drop --tokenizer")


@pytest.mark.parametrize("args, flag", [
    (["--nsamples", "-1"], "--nsamples"),
    (["--seqlen", "1"], "--seqlen"),
    (["--tokenizer", "missing-tokenizer"], "--tokenizer"),
])
def test_rtn_without_calibration_refuses_calibration_options_it_would_ignore(args, flag, tmp_path, capsys):
    code, out, err = run_cli(["quantize", "--method", "rtn", "--out", tmp_path / "q", *args], capsys)
    one_line_error(code, err, 2, f"{flag} applies to calibration data", "add --calib")
    assert not (tmp_path / "q").exists()


def test_unreadable_tokenizer_says_it_cannot_be_read(tmp_path, capsys):
    from salactl.runtime.loader import EMBEDDED_DIR

    path = tmp_path / "tokenizer.json"
    path.write_bytes((EMBEDDED_DIR / "tokenizer.json").read_bytes())
    r = unreadable_run(path, ["run", "--tokenizer", path, "--prompt", "hi", "-n", "1"])
    one_line_error(r.returncode, r.stderr, 5, "cannot read tokenizer", "Permission denied")
    assert "not a valid tokenizer.json" not in r.stderr


@pytest.mark.parametrize("args", [["report", "memory", "--model", ""],
                                  ["bench", "--model", "", "--scale", "0.002"],
                                  ["quantize", "--out", "", "--method", "rtn"],
                                  ["quantize", "--calib", "", "--out", "q"]])
def test_empty_model_out_and_calib_are_usage_errors_everywhere(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(args, capsys)
    assert code == 2 and err.startswith("error: ") and "is empty" in err, err
    assert len(err.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, flag", [
    (["bench", "--dataset", "", "--scale", "0.002"], "--dataset"),
    (["bench", "--endpoint", "", "--scale", "0.002"], "--endpoint"),
    (["run", "--prompt", "hi", "--tokenizer", ""], "--tokenizer"),
    (["eval", "ppl", "-f", ""], "--file"),
    (["report", "latency", ""], "a records path"),
    (["report", "memory", "--records", " "], "--records"),
    (["profile", "--ncu", "--ncu-path", ""], "--ncu-path"),
])
def test_empty_values_are_refused_when_parsed_not_read_as_unset(args, flag, tmp_path, monkeypatch, capsys):
    """An empty value is refused as the option is parsed (long or short form), whatever the host
    process's own command line holds."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(args, capsys)
    assert code == 2 and err.strip() == err.strip().splitlines()[0] and f"error: {flag} is empty; give " in err, err
    assert list(tmp_path.iterdir()) == []


def test_out_dot_is_the_working_directory_even_when_the_host_argv_has_an_empty_out(tmp_path, monkeypatch):
    """Typer reads "" as Path("."): the refusal must come from the value given to the app, not
    from scanning sys.argv (an in-process caller's argv is not the app's)."""
    from typer.testing import CliRunner

    from salactl.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["host", "--out", ""])
    r = CliRunner().invoke(app, ["run", "--prompt-ids", "1,2", "-n", "1", "--json", "--out", "."])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "records.jsonl").is_file()
    monkeypatch.setattr("sys.argv", ["host"])
    r = CliRunner().invoke(app, ["run", "--prompt-ids", "1,2", "-n", "1", "--out", ""])
    assert r.exit_code != 0 and "--out is empty" in str(r.exception)
