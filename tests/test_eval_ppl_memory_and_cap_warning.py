"""`salactl eval ppl`: the memory of the token ids (counted in the --file read cap, the longest window
counted rather than built, running out of memory while tokenizing is exit 11), and the warning that
--max-tokens cut the window only where it left tokens unscored (with and without <s>)."""

import json
import os
import shutil
import subprocess
import sys
import tracemalloc

import pytest

from salactl import input_files
from salactl.cmd_eval import IDS_BYTES_PER_BYTE, _file_read_cap
from salactl.data.corpus import corpus_text
from salactl.evaluation.perplexity import encode_text, longest_window, score_windows, scored_targets
from salactl.runtime.loader import EMBEDDED_DIR, available_host_bytes
from salactl.runtime.tokenizer import Tokenizer


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("bos_id", [None, 1])
@pytest.mark.parametrize("seq_len", [2, 3, 8, 1000])
def test_the_longest_window_is_counted_as_the_windows_are_built(seq_len, bos_id):
    for n in (0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 100):
        ids = list(range(100, 100 + n))
        for max_tokens in (None, 1, 2, 6, 7, 8, 50, 10**9):
            windows = list(score_windows(ids, seq_len, max_tokens, bos_id))
            assert longest_window(n, seq_len, max_tokens, bos_id) == max(map(len, windows), default=0)
            assert scored_targets(ids, seq_len, max_tokens, bos_id) == [t for w in windows for t in w[1:]]
            assert all(len(w) <= seq_len for w in windows)


def test_the_ids_memory_per_byte_bounds_what_eval_ppl_holds():
    """Measured (tracemalloc) on the sala-nano tokenizer: encode_text's ids, then the unigram
    baseline's targets beside them, per byte of UTF-8 text, on texts of 0.27 to 1 token a byte."""
    tok = Tokenizer(EMBEDDED_DIR)
    texts = [corpus_text("train")[:300_000], "1234567890 " * 30_000, "中文字符测试" * 18_000,
             "~!@#$%^&*()" * 30_000, "\u00ad\u0100\u0101" * 60_000]
    for text in texts:
        tracemalloc.start()
        try:
            ids = encode_text(tok, text, None, "the text")
            targets = scored_targets(ids, 1024, None, tok.bos_id)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(targets) == len(ids) and peak <= IDS_BYTES_PER_BYTE * len(text.encode()), text[:20]


def test_the_file_read_cap_counts_the_ids_where_they_may_all_be_held():
    if available_host_bytes() is None:
        pytest.skip("the available memory is unknown: no cap")
    whole = input_files.DECODED_BYTES_PER_BYTE + IDS_BYTES_PER_BYTE
    for max_tokens in (0, 1 << 20, 10**9):
        cap = _file_read_cap(max_tokens)
        assert f"({whole} bytes per byte of the file)" in cap.why and "token ids" in cap.why
        assert cap.max_bytes * whole <= available_host_bytes() * 1.05
    few = _file_read_cap(16384)
    assert f"({input_files.DECODED_BYTES_PER_BYTE} bytes per byte of the file)" in few.why


# The runtime modules load before the address-space limit, which then leaves 240 MiB: enough to load
# sala-nano and tokenize 8 MB of digits (an id a byte, 64 MiB of ids; the tokenizer aborts the
# process below ~170), not for the whole-text copies of the ids that counting the longest window
# (one window: --seq-len past the text) by building it took (~260): a traceback, exit 1
LIMITED = """
import resource, sys
import salactl.cli, salactl.cmd_eval, salactl.runtime.engine, salactl.runtime.loader, tokenizers, torch
import salactl.runtime.host_memory as host_memory
host_memory._address_space_available = lambda proc: None   # the checks see no limit, as with one a container hides
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 240 * 2**20, resource.RLIM_INFINITY))
sys.argv = ["salactl", *sys.argv[1:]]
salactl.cli.main()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_eval_ppl_of_the_whole_text_under_little_memory_is_exit_11(tmp_path):
    text = tmp_path / "digits.txt"
    text.write_text("1234567890 " * 727_273)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}       # no per-core thread stacks inside the limit
    r = subprocess.run([sys.executable, "-c", LIMITED, "eval", "ppl", "--file", str(text), "--max-tokens", "0",
                        "--seq-len", "100000000", "--device", "cpu"], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 11 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(errors) == 1 and errors[0].startswith("error: eval ppl "), r.stderr


def _ppl(text, *args):
    r = salactl("eval", "ppl", "--file", str(text), "--seq-len", "100", "--device", "cpu", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), "--max-tokens 0 (the whole text)" in r.stderr


def test_the_capped_window_warning_only_where_the_cap_left_tokens_unscored(tmp_path):
    nobos = tmp_path / "nobos"
    shutil.copytree(EMBEDDED_DIR, nobos, ignore=shutil.ignore_patterns("*.safetensors*"))
    config = json.loads((nobos / "tokenizer_config.json").read_text())
    (nobos / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False}))
    text = tmp_path / "t.txt"
    text.write_text("def join(a, b):\n    return a + b\n" * 5)
    n = len(Tokenizer(nobos).encode(text.read_text(), add_special_tokens=False, specials_as_text=True))
    assert n < 99
    whole, warned = _ppl(text, "--tokenizer", str(nobos), "--max-tokens", "0")
    assert whole["tokens"] == n - 1 and not whole["bos"] and not warned
    every, warned = _ppl(text, "--tokenizer", str(nobos), "--max-tokens", str(n - 1))     # all n - 1 scored
    assert (every["tokens"], every["nll"]) == (whole["tokens"], whole["nll"]) and not warned
    cut, warned = _ppl(text, "--tokenizer", str(nobos), "--max-tokens", str(n - 2))
    assert cut["tokens"] == n - 2 and warned
    with_bos, warned = _ppl(text, "--max-tokens", str(n - 1))                            # n scorable after <s>
    assert with_bos["bos"] and with_bos["tokens"] == n - 1 and warned
    all_bos, warned = _ppl(text, "--max-tokens", str(n))
    assert all_bos["tokens"] == n and not warned
