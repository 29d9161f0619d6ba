import os

import pytest
import torch

from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.loader import build_model
from salactl.runtime.presets import sala_nano


def pytest_make_parametrize_id(config, val, argname):
    """A long str/bytes parameter (a 200,000-byte nested JSON) is named by its length: pytest before 9
    spelled such values out in the test id, and tools/gpu_tests.py passes ids on a command line, where
    one argument may hold at most 128 KiB (the shard then failed with E2BIG)."""
    if isinstance(val, (str, bytes)) and len(val) > 200:
        return f"{argname}-{len(val)}-{'bytes' if isinstance(val, bytes) else 'chars'}"
    return None


@pytest.fixture(autouse=True)
def _no_debug_tracebacks(monkeypatch):
    """SALACTL_DEBUG=1 in the developer's shell turns one-line errors into tracebacks, which many
    tests (and the CLIs they start as subprocesses) check for; tests that want it set it themselves."""
    monkeypatch.delenv("SALACTL_DEBUG", raising=False)


def tiny_config(**sparse_overrides):
    cfg = sala_nano(vocab_size=512)
    if sparse_overrides:
        import dataclasses
        cfg = cfg.replace(sparse_config=dataclasses.replace(cfg.sparse_config, **sparse_overrides))
    return cfg


def tiny_model(cfg=None, seed=0, dtype=torch.float32) -> SalaForCausalLM:
    cfg = cfg or tiny_config()
    return build_model(cfg, random_state_dict(cfg, "cpu", dtype, seed))


def micro_model(dtype=torch.float32) -> SalaForCausalLM:
    """3 layers (sparse, lightning, sparse), hidden 32, dense_len 40 and 16-token blocks: prompts of
    a few dozen tokens reach the sparse path; for interpreter-speed engine tests."""
    from salactl.runtime.config import LIGHTNING, SPARSE, SalaConfig, SparseConfig

    cfg = SalaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     mixer_types=(SPARSE, LIGHTNING, SPARSE), lightning_nh=4, lightning_nkv=4,
                     lightning_head_dim=16, dim_model_base=16, eos_token_id=(2,), initializer_range=0.1,
                     sparse_config=SparseConfig(block_size=16, dense_len=40, init_blocks=1, kernel_size=8,
                                                kernel_stride=4, topk=1, window_size=16))
    return build_model(cfg, random_state_dict(cfg, "cpu", dtype, 5))


def topk_micro_model(dtype=torch.float32) -> SalaForCausalLM:
    """micro_model's shapes in 2 layers (sparse, lightning) with topk 4 > init_blocks 1 and dense_len
    136: at the first sparse position (135, block 8), six unforced blocks compete for the two places
    the forced ones leave, so selection reads the compressed keys (micro_model's topk 1 keeps only
    forced blocks). One sparse layer halves the interpreter's sparse decode step (~4 s)."""
    from salactl.runtime.config import LIGHTNING, SPARSE, SalaConfig, SparseConfig

    cfg = SalaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     mixer_types=(SPARSE, LIGHTNING), lightning_nh=4, lightning_nkv=4,
                     lightning_head_dim=16, dim_model_base=16, eos_token_id=(2,), initializer_range=0.1,
                     sparse_config=SparseConfig(block_size=16, dense_len=136, init_blocks=1, kernel_size=8,
                                                kernel_stride=4, topk=4, window_size=16))
    return build_model(cfg, random_state_dict(cfg, "cpu", dtype, 5))


def run_backend(cfg, q, k, v, chunks, backend=None, **cache_kwargs):
    """One sparse layer's softmax attention through a backend (the reference one by default), fed
    in the given chunk sizes as prefill and decode feed it; the outputs of every chunk, in order.
    cache_kwargs go to the SequenceCache (kv_cache_dtype, kv_scales)."""
    from salactl.runtime.backend_reference import ReferenceBackend
    from salactl.runtime.batch import ForwardBatch
    from salactl.runtime.cache import SequenceCache

    backend = backend or ReferenceBackend(cfg)
    seq = SequenceCache(cfg, "cpu", q.dtype, **cache_kwargs)
    layer = cfg.sparse_layers[0]
    outs, off = [], 0
    for n in chunks:
        b = ForwardBatch.build(cfg, [seq], [n], backend, "cpu")
        outs.append(backend.softmax_attention(layer, q[off:off + n], k[off:off + n], v[off:off + n], b))
        b.commit()
        off += n
    return torch.cat(outs)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(1234)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def unwritable_out(tmp_path, case: str) -> str:
    """An --out no command can write: inside /proc ("proc", even for root) or below a file."""
    if case == "proc":
        if not os.path.isdir("/proc/self"):
            pytest.skip("no /proc")
        return "/proc/salactl-nope"
    (tmp_path / "f").write_text("x")
    return str(tmp_path / "f" / "sub")


def run_cli(args, capsys) -> tuple[int, str, str]:
    """`salactl ARGS` in this process through the console entry point: (exit code, stdout, stderr)."""
    import sys

    from salactl.cli import main

    argv, sys.argv = sys.argv, ["salactl", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    finally:
        sys.argv = argv
    out, err = capsys.readouterr()
    return code, out, err


def run_cli_ok(*args) -> None:
    """`salactl ARGS` in this process through the real entry point, for fixtures that have no capsys;
    fails unless it exits 0."""
    import sys

    from salactl.cli import main

    argv, sys.argv = sys.argv, ["salactl", *map(str, args)]
    try:
        main()
    except SystemExit as e:
        assert not e.code, f"salactl {' '.join(map(str, args))} exited {e.code}"
    finally:
        sys.argv = argv


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size): a tmpfs of that size (say "12m") mounted at a new directory under tmp_path,
    unmounted after the test (root only; skipped where mounting is not allowed)."""
    import subprocess

    mounted = []

    def mount(size: str):
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                               capture_output=True).returncode:
            pytest.skip("mounting a tmpfs needs root")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


@pytest.fixture(scope="session")
def nano_rtn_dir(tmp_path_factory):
    """sala-nano quantized by `salactl quantize --method rtn` (W4A16 g128); tests copy it before editing."""
    out = tmp_path_factory.mktemp("q") / "rtn"
    run_cli_ok("quantize", "--model", "sala-nano", "--out", out, "--method", "rtn")
    return out


@pytest.fixture
def quick_thread_switches():
    """Loopback server and client threads share one interpreter: switch the GIL every 1 ms, not 5 ms."""
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    yield
    sys.setswitchinterval(old)


def assert_stop_token_and_stream_order(engine) -> None:
    """A GPUEngine's per-request stop token ends the request after that token, and events() yields
    the tokens in time order, matching result()."""
    from salactl.runtime.sampling import SamplingParams

    free = engine.generate([3, 4, 5], SamplingParams(max_new_tokens=6, ignore_eos=True)).output_token_ids
    stop = free[2]
    assert free.index(stop) < 5                         # the stop comes before max_new_tokens
    rid = engine.submit([3, 4, 5], SamplingParams(max_new_tokens=6, stop_token_ids=(stop,)))
    events = list(engine.events())
    res = engine.result(rid)
    assert res.finish_reason == "stop" and res.output_token_ids == free[:free.index(stop) + 1]
    assert [t for r, t, _ in events if r == rid] == res.output_token_ids
    assert all(a[2] <= b[2] for a, b in zip(events, events[1:]))


def end_a_nan_request(engine, prompt, params, end: str, chunk: int) -> None:
    """Run `prompt` (NaN K/V from its first token) on a one-request GPUEngine until it ends as
    `end`: "failed" (NumericsError at its first token), "prefill_only" (max_new_tokens 0: never
    sampled) or "aborted_mid_prefill" (after two prefill chunks of `chunk` tokens)."""
    from salactl.errors import NumericsError
    from salactl.runtime.sampling import SamplingParams

    if end == "failed":
        with pytest.raises(NumericsError):
            engine.generate(prompt, params)
    elif end == "prefill_only":
        assert engine.generate(prompt, SamplingParams(max_new_tokens=0)).finish_reason == "length"
    else:
        rid = engine.submit(prompt, params)
        engine.step()
        engine.step()
        assert engine.requests[rid].prefilled == 2 * chunk
        engine.abort(rid)
