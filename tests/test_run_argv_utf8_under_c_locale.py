"""`salactl run` under an ASCII locale with UTF-8 mode off (PYTHONUTF8=0 LC_ALL=C): Python hands argv
bytes >= 0x80 over as lone surrogates ("\\udcc3"), yet the text options are UTF-8 and the paths in the
output name the real files, as under a UTF-8 locale; only bytes that are not UTF-8 are refused."""

import json
import os
import subprocess
import sys

import pytest

from conftest import run_cli
from salactl.input_files import utf8_text

pytestmark = pytest.mark.skipif(sys.platform != "linux" or sys.getfilesystemencoding() != "utf-8",
                                reason="compares a POSIX ASCII locale with this process's UTF-8 one")

PROMPT = "héllo — 你好 🙂"
TEXT_ARGS = ["--chat", "--prompt", PROMPT, "--system", "sÿstem é", "--stop", "zzé",
             "--chat-template-kwargs", 'name="ñame"', "--label", "lé 你", "-n", "2", "--random-weights",
             "--no-op-profile", "--device", "cpu", "--json"]


def run_in_c_locale(args: list[str | bytes], command: bytes = b"run") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_") and k not in ("LANG", "SALACTL_DEBUG")}
    env.update(PYTHONUTF8="0", LC_ALL="C", OMP_NUM_THREADS="1")
    argv = [a if isinstance(a, bytes) else a.encode("utf-8") for a in args]
    return subprocess.run([sys.executable.encode(), b"-m", b"salactl", command, *argv], capture_output=True,
                          timeout=600, env=env)


def test_utf8_text_options_run_and_json_paths_name_the_real_file(tmp_path, capsys):
    out = os.fsencode(tmp_path) + "/dé 你".encode() + b"\xff"       # a byte that is not UTF-8 too
    r = run_in_c_locale([*TEXT_ARGS, "-o", out])
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    result = json.loads(r.stdout)
    shown = result["files"]["records"]
    # as under a UTF-8 locale: the UTF-8 name as text, the stray byte as its lone surrogate
    assert shown == str(tmp_path) + "/dé 你\udcff/records.jsonl"
    assert os.fsencode(shown) == out + b"/records.jsonl" and os.path.isfile(shown)
    records = [json.loads(line) for line in open(shown, encoding="utf-8")]
    assert {rec["label"] for rec in records} == {"lé 你"}
    assert records[0]["knobs"]["system"] == "sÿstem é" and records[0]["knobs"]["stop"] == ["zzé"]
    assert records[0]["knobs"]["chat_template_kwargs"] == {"name": "ñame"}

    code, same, err = run_cli(["run", *TEXT_ARGS, "-o", tmp_path / "utf8"], capsys)      # this process's UTF-8 argv
    assert code == 0, err
    assert result["prompt_token_ids"] == json.loads(same)["prompt_token_ids"]
    assert result["sampling"]["stop"] == ["zzé"]


@pytest.mark.parametrize("flag", ["--prompt", "--system", "--stop"])
def test_a_byte_that_is_not_utf8_is_still_refused_at_its_offset(flag):
    args = ["--prompt", "hi", "-n", "1"] if flag != "--prompt" else ["-n", "1"]
    r = run_in_c_locale([flag, "é".encode() + b"\xff", *args, "--json"])
    assert r.returncode == 2 and r.stdout == b""
    prefix = "stop strings (--stop): " if flag == "--stop" else f"{flag}: "
    assert r.stderr.decode().splitlines()[0].startswith(
        f"error: {prefix}the text is not valid UTF-8 (byte 0xff at character offset 1)")


def test_a_label_byte_that_is_not_utf8_is_still_refused(tmp_path):
    r = run_in_c_locale(["--prompt", "hi", "--label", "é".encode() + b"\xff", "-o", str(tmp_path), "--json"])
    assert r.returncode == 2 and r.stdout == b""
    assert "--label 'é\\udcff' is not valid UTF-8" in r.stderr.decode()


def test_utf8_text_decodes_locale_bytes_as_utf8():
    # this process's file system encoding is UTF-8: "é" stays, stray bytes stay surrogates
    assert utf8_text("d\udcc3\udca9 \udcff") == "dé \udcff"
    assert utf8_text("dé") == "dé" and utf8_text("plain") == "plain"
    assert utf8_text("\ud83d") == "\ud83d"      # a JSON escape, not from bytes: kept for the checks to name


@pytest.mark.parametrize("command,args", [
    (b"bench", ["--device", "cpu", "--random-weights", "--num-requests", "1", "--phases", "S1", "--scale", "0.01"]),
    (b"sweep", ["--device", "cpu", "--random-weights", "--dense-len", "64", "--input-len", "64", "--output-len", "2",
                "--requests", "1", "--no-passkey", "--no-kl"]),
], ids=["bench", "sweep"])
def test_bench_and_sweep_labels_are_utf8(tmp_path, command, args):
    r = run_in_c_locale([*args, "--label", "lé 你", "-o", os.fsencode(tmp_path), "--json"], command)
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    records = [json.loads(line) for line in open(tmp_path / "records.jsonl", encoding="utf-8")]
    assert records and {rec["label"] for rec in records} == {"lé 你"}
