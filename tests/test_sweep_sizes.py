"""sweep_sizes.attention_scores_bytes: the largest chunk's attention temporaries, found among O(1)
candidate chunks, equal the walk over every chunk, and a 10^12-token prompt is sized at once."""

import random
import subprocess
import sys

from salactl.bench.sweep_sizes import SCORE_COPIES, attention_scores_bytes
from salactl.runtime.loader import model_config
from salactl.runtime.ops.selection import num_windows

NANO = model_config("sala-nano")


def every_chunk(config, tokens: int, chunk: int, dense_len: int) -> int:
    worst = 0
    for start in range(0, tokens, chunk):
        end = min(start + chunk, tokens)
        dense = max(0, min(end, dense_len - 1) - start)
        worst = max(worst, dense * end + (end - start - dense) * num_windows(end, config.sparse_config))
    return SCORE_COPIES * 4 * config.num_attention_heads * worst


def test_the_candidate_chunks_find_the_largest_one():
    rng = random.Random(0)
    for _ in range(1500):
        tokens, chunk = rng.randint(1, 20000), rng.randint(1, 3000)
        dense_len = rng.choice([0, 1, 2, chunk, chunk + 1, rng.randint(0, 25000)])
        assert attention_scores_bytes(NANO, tokens, chunk, dense_len) == every_chunk(NANO, tokens, chunk, dense_len)


def test_a_huge_prompt_is_sized_without_walking_its_chunks():
    # a walk over its 2e9 chunks would not finish within the timeout
    code = ("from salactl.bench.sweep_sizes import attention_scores_bytes; from salactl.runtime.loader import "
            "model_config; print(attention_scores_bytes(model_config('sala-nano'), 10 ** 12, 512, 4096))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and int(r.stdout) > 0, r.stderr
