"""Input text that is not a regular file: `run --prompt-file` and `eval ppl --file` read a FIFO or a
process substitution as they read a file, but stop a device such as /dev/zero once it holds more than
the memory allows (exit 11, saying the cap and the fix), instead of reading it forever. And the sweep's
host-memory check counts the reference engine's KV cache at its peak, as run and eval do."""

import json
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

from salactl.bench.sweep_sizes import prefill_bytes, sweep_prefill_bytes
from salactl.bench.synthetic import prompt_set_bytes
from salactl.errors import CapacityError
from salactl.evaluation.perplexity import engine_prefill_bytes
from salactl.input_files import TOKENIZER_BYTES_PER_BYTE, ReadCap, read_text_option
from salactl.runtime.loader import available_host_bytes, model_config
from salactl.units import human_bytes

NANO = model_config("sala-nano")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.path.exists("/dev/zero"),
                                reason="needs /dev/zero, mkfifo and /proc/meminfo")

# the CLI with at most 1 GB more mapped than its modules take (a reader that never stops fails fast
# instead of filling the machine) and the machine's available memory, or argv[1] bytes in its place
LIMITED = """
import resource, sys
import salactl.cli, salactl.cmd_eval, salactl.cmd_run, salactl.run_job, salactl.runtime.loader as loader, torch
import salactl.runtime.host_memory as host_memory
host_memory._address_space_available = lambda proc: None   # the checks see no limit, as with one a container hides
avail = sys.argv.pop(1)
if avail != "machine":
    loader.available_host_bytes = lambda meminfo=None: int(avail)
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
sys.argv = ["salactl", *sys.argv[1:]]
salactl.cli.main()
"""


def limited(avail, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}       # no per-core thread stacks inside the limit
    return subprocess.run([sys.executable, "-c", LIMITED, str(avail), *args], capture_output=True, text=True,
                          timeout=120, env=env)


def error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == CapacityError.exit_code, (r.returncode, r.stderr[-2000:])
    lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("warning: ")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


def capped_bytes(line: str) -> int:
    return int(re.search(r"holds more than [0-9.]+ [KMGT]?i?B \(([0-9,]+) bytes\)", line).group(1).replace(",", ""))


def test_run_stops_reading_dev_zero_at_what_the_tokenizer_could_encode():
    avail = available_host_bytes()
    if avail is None or avail // TOKENIZER_BYTES_PER_BYTE > 400 * 2**20:
        pytest.skip("this machine's cap would read over 400 MB of /dev/zero")
    r = limited("machine", "run", "--prompt-file", "/dev/zero", "-n", "1", "--device", "cpu")
    line = error_line(r)
    assert line.startswith("error: --prompt-file /dev/zero holds more than ")
    assert "the most the tokenizer can encode in the " in line and line.endswith(
        f"of memory available ({TOKENIZER_BYTES_PER_BYTE} bytes per byte of the file); shorten the prompt")
    # the cap is check_tokenizer_memory's (the memory available moves a little between processes)
    assert capped_bytes(line) == pytest.approx(avail // TOKENIZER_BYTES_PER_BYTE, rel=0.2) and r.stdout == ""


def test_eval_ppl_stops_reading_dev_zero_at_what_memory_holds():
    """On a machine with 90 MiB available the file may hold 10 MiB (9 bytes held per byte read)."""
    r = limited(90 * 2**20, "eval", "ppl", "--file", "/dev/zero", "--device", "cpu")
    line = error_line(r)
    assert line == ("error: --file /dev/zero holds more than 10.0 MiB (10,485,760 bytes), the most its bytes and "
                    "decoded text fit in the 90.0 MiB of memory available (9 bytes per byte of the file); give a "
                    "smaller --file (eval ppl reads it whole before encoding it)")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for a process substitution")
def test_run_reads_a_process_substitution_as_a_prompt():
    r = subprocess.run(["bash", "-c", f"{sys.executable} -m salactl run --prompt-file <(printf 'Once upon a time') "
                                      "-n 1 --device cpu --json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["prompt_token_ids"]) > 3


def fifo_with(tmp_path, data: bytes):
    path = tmp_path / "fifo"
    os.mkfifo(path)

    def write():
        with open(path, "wb") as f:
            try:
                f.write(data)
            except BrokenPipeError:         # the reader stopped at its cap
                pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return path, writer


def test_a_fifo_within_the_cap_is_read_whole_as_a_file_is(tmp_path):
    """The text as it is (its line endings too) without a leading byte-order mark, as from a file."""
    path, writer = fifo_with(tmp_path, b"\xef\xbb\xbfone\r\ntwo\rthree\n" * 1000)
    assert read_text_option(path, "--file", cap=ReadCap(1 << 20, "why", "fix")) == \
        "one\r\ntwo\rthree\n" + "\ufeffone\r\ntwo\rthree\n" * 999
    writer.join(10)


CRLF_TEXT = "def add(a, b):\r\n    return a + b\r\n"


def _cli_json(*args) -> dict:
    r = subprocess.run([sys.executable, "-m", "salactl", *args, "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_crlf_file_is_read_as_it_is(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"\xef\xbb\xbf" + CRLF_TEXT.encode() + b"old mac\rend")
    assert read_text_option(path, "--prompt-file") == CRLF_TEXT + "old mac\rend"


def test_run_prompt_file_and_eval_file_use_a_crlf_files_exact_text(tmp_path):
    from salactl.runtime.loader import EMBEDDED_DIR
    from salactl.runtime.tokenizer import Tokenizer

    crlf, lf = tmp_path / "crlf.txt", tmp_path / "lf.txt"
    crlf.write_bytes(CRLF_TEXT.encode())
    lf.write_bytes(CRLF_TEXT.replace("\r\n", "\n").encode())
    tok = Tokenizer(EMBEDDED_DIR)
    run = _cli_json("run", "--prompt-file", str(crlf), "--max-new-tokens", "1", "--no-op-profile")
    assert run["prompt_token_ids"] == tok.encode(CRLF_TEXT) != tok.encode(CRLF_TEXT.replace("\r\n", "\n"))
    a, b = (_cli_json("eval", "ppl", "--device", "cpu", "--file", str(f)) for f in (crlf, lf))
    assert a["tokens"] - b["tokens"] == len(tok.encode(CRLF_TEXT)) - len(tok.encode(CRLF_TEXT.replace("\r\n", "\n"))) > 0


def test_a_fifo_past_the_cap_stops_there(tmp_path):
    path, writer = fifo_with(tmp_path, b"x" * (3 << 20))
    with pytest.raises(CapacityError, match=r"^--file \S+ holds more than 1\.0 MiB \(1,048,576 bytes\), the most "
                                            r"x; do y$"):
        read_text_option(path, "--file", cap=ReadCap(1 << 20, "the most x", "do y"))
    writer.join(10)


def test_a_file_of_exactly_the_cap_is_read(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(b"a" * 4096)
    assert read_text_option(path, "--file", cap=ReadCap(4096, "why", "fix")) == "a" * 4096
    with pytest.raises(CapacityError):
        read_text_option(path, "--file", cap=ReadCap(4095, "why", "fix"))


# ---- the sweep's CPU check counts the KV cache at its peak ------------------------------------

@pytest.mark.parametrize("tokens, cached, chunk", [(300, 301, 64), (16385, 16417, 512), (1000, 1000, 1000),
                                                   (100, 700, 32)])
def test_the_sweep_counts_a_prefill_as_run_and_eval_do(tokens, cached, chunk):
    assert sweep_prefill_bytes(NANO, tokens, cached, 1, chunk, NANO.sparse_config.dense_len, 4) == \
        engine_prefill_bytes(NANO, tokens, cached, chunk, 4)


def test_the_sweeps_refusal_counts_the_doubled_kv_cache():
    """2^k prompt tokens fill the KV cache to its capacity; the one decode step after them doubles it.
    The refusal's figure is that peak, not the tokens' KV alone (prompt sizes no machine holds: the
    sweep is refused before it allocates anything either way)."""
    avail = available_host_bytes()
    if avail is None:
        pytest.skip("available host memory unknown")
    dense = NANO.sparse_config.dense_len
    n = next(2**k for k in range(20, 40) if prefill_bytes(NANO, 2**k, 2**k + 1, 1, 512, dense, 4) > 2 * avail)
    if prompt_set_bytes(1, n) > avail:          # the prompt set's own check would refuse first
        pytest.skip("too little memory for the prompt set of a prompt that large")
    r = subprocess.run([sys.executable, "-m", "salactl", "sweep", "--device", "cpu", "--dtype", "float32",
                        "--input-len", str(n), "--output-len", "1", "--requests", "1", "--no-kl", "--no-passkey"],
                       capture_output=True, text=True, timeout=120)
    line = error_line(r)
    need = sweep_prefill_bytes(NANO, n, n + 1, 1, 512, dense, 4)
    kv = 2 * len(NANO.sparse_layers) * NANO.num_key_value_heads * NANO.head_dim * 4 * n    # the tokens' K and V
    assert need - prefill_bytes(NANO, n, n + 1, 1, 512, dense, 4) > kv                     # the cache doubled
    assert f"1 request(s) of {n + 1:,} tokens" in line and f" needs {human_bytes(need)}, but " in line
