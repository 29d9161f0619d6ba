"""The Python API leaves its caller's global state alone: Python's and torch's random generators,
torch's default dtype, thread count and grad mode are what they were before loading a model and
generating (a script seeding `random` for its own sampling must get the same draws)."""

import subprocess
import sys

SCRIPT = """
import random, torch

def state():
    return {"python random": random.getstate(), "torch rng": torch.get_rng_state().tolist(),
            "dtype": torch.get_default_dtype(), "threads": torch.get_num_threads(), "grad": torch.is_grad_enabled()}

random.seed(0); torch.manual_seed(0)
before = state()
from salactl import Engine, SamplingParams, load_model
lm = load_model("sala-nano")
Engine(lm).generate([1, 5, 9], SamplingParams(max_new_tokens=3, temperature=0.8, seed=3))
after = state()
print(",".join(k for k in before if before[k] != after[k]) or "same")
"""


def test_load_and_generate_leave_global_state_alone():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "same", r.stdout
