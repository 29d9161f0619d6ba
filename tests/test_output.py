import os
import subprocess
import sys
from pathlib import Path

import pytest

from salactl import output


def test_consoles_print_brackets_verbatim(capsys):
    """Install hints, paths and module names keep their brackets (rich markup is off), and a
    closing-tag look-alike does not raise."""
    output.stderr.print("note: no Pareto plot: matplotlib is missing (pip install 'salactl[plots]'); runs/[/x]")
    output.table("modules", ["name", "error"], [["model.layers[0].mlp[gate]", 0.5]])
    got = capsys.readouterr()
    assert "pip install 'salactl[plots]'" in got.err and "runs/[/x]" in got.err
    assert "model.layers[0].mlp[gate]" in got.out


def test_warn_once_prints_each_warning_once(capsys):
    for _ in range(3):
        output.warn_once("fla-core is missing (test)")
    output.warn_once("another (test)")
    err = capsys.readouterr().err
    assert err.count("warning: fla-core is missing (test)") == 1 and err.count("warning: another (test)") == 1


def test_console_numbers_show_one_decimal_from_a_hundred_up():
    """Console tables print 1234.5 in full (one decimal), not rounded to four significant digits."""
    assert output.fmt(1234.5) == "1234.5"
    assert output.fmt(12.345) == "12.35"


@pytest.mark.parametrize("args", [["run", "--prompt", "hi", "-n", "2"], ["sweep", "--topk", "2"],
                                  ["profile", "--torch", "--phase", "decode"],
                                  ["bench", "--profile", "decode", "--scale", "0.002"]])
def test_out_naming_a_file_is_a_one_line_usage_error(tmp_path, args):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    r = subprocess.run([sys.executable, "-m", "salactl", *args, "--out", str(afile)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and f"--out {afile} is a file" in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and afile.read_text() == "keep me"


@pytest.mark.parametrize("case", ["below_a_file", "records_is_a_dir", "not_writable"])
def test_out_that_cannot_be_written_is_a_one_line_usage_error(tmp_path, case):
    if case == "below_a_file":
        (tmp_path / "f").write_text("x")
        out, msg = tmp_path / "f" / "sub", "which is a file"
    elif case == "records_is_a_dir":
        out, msg = tmp_path / "o", "records.jsonl is a directory, where a file must go"
        (out / "records.jsonl").mkdir(parents=True)
    else:                               # /proc takes no new files, even from root
        out, msg = Path("/proc/salactl-test/o"), "cannot write in /proc"
    r = subprocess.run([sys.executable, "-m", "salactl", "run", "--prompt", "hi", "-n", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and msg in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


def test_debug_mode_shows_the_traceback_and_keeps_the_exit_code(tmp_path):
    env = dict(os.environ, SALACTL_DEBUG="1")
    r = subprocess.run([sys.executable, "-m", "salactl", "run", "--model", str(tmp_path / "none"), "--prompt",
                        "hi"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 4 and "Traceback" in r.stderr and r.stderr.rstrip().splitlines()[-1].startswith("error:")


def test_past_the_trained_length_is_a_warning_only_past_it(capsys):
    output.warn_past_trained_length(65536, 65536, "the prompt (test a)")
    output.warn_past_trained_length(65537, 65536, "the prompt (test b)")
    err = capsys.readouterr().err
    assert "test a" not in err and "the prompt (test b) is 65,537 tokens, past the model's" in err


def test_sigterm_ends_a_command_like_ctrl_c_with_exit_143(tmp_path):
    """SIGTERM (a job scheduler, `timeout`, `kill`) runs the same cleanup as Ctrl-C: one line on
    stderr, exit 128 + 15. The child is stopped while it waits on a server that accepted its
    connection (so it is inside the command, past start-up) and never answers."""
    import signal
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(120)
    port = srv.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "salactl", "bench", "--profile", "soar", "--endpoint",
                          f"http://127.0.0.1:{port}", "--backend", "openai", "--model", "m", "--out",
                          str(tmp_path / "b")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        conn, _ = srv.accept()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        srv.close()
    assert p.returncode == 143, err
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err, err


def test_git_sha_only_from_salactls_own_checkout(tmp_path):
    """An installed package's parent folder may be inside the user's repository: not our commit."""
    from salactl.env import _git

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert _git(tmp_path) == {"git_sha": None, "git_dirty": None}


def test_termination_with_a_worker_thread_inside_torch_still_exits_143():
    """bench's engine thread may be mid-prefill when SIGTERM's cleanup ends: the process exits 143
    at once instead of aborting (134) in the interpreter's teardown."""
    code = ("import threading, torch\n"
            "from salactl import cli\n"
            "def busy():\n"
            "    x = torch.randn(1500, 1500)\n"
            "    while True:\n"
            "        x @ x\n"
            "threading.Thread(target=busy, daemon=True).start()\n"
            "cli._terminated[0] = True\n"
            "cli._interrupted()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 143 and p.stderr.strip() == "terminated", (p.returncode, p.stderr)


def test_sigterm_during_an_embedded_prefill_exits_143_without_waiting_for_the_step(tmp_path):
    """bench's engine thread in a long prefill step (SOAR S1 at scale 1 on the CPU) is not waited
    for once SIGTERM unwinds: the process exits 143 within seconds, leaving no --out."""
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-m", "salactl", "bench", "--phases", "S1", "--num-requests", "1",
                          "--device", "cpu", "--out", str(tmp_path / "o")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the plan's length warning comes once salactl has imported and read its arguments (a loaded
        # machine can take 10 s for that alone); the 80K-token warmup prefill lasts minutes on a CPU
        assert "past the model's max_position_embeddings" in p.stderr.readline()
        time.sleep(10)                           # loaded, and inside the warmup request's prefill
        p.send_signal(signal.SIGTERM)
        t0 = time.perf_counter()
        _, err = p.communicate(timeout=60)
        waited = time.perf_counter() - t0
    finally:
        p.kill()
    assert p.returncode == 143 and err.strip().splitlines()[-1] == "terminated", err
    assert waited < 15 and not (tmp_path / "o").exists(), waited
