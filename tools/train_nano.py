"""Train the embedded `sala-nano` model with the runtime's own layers (runtime/layers/*).

    python tools/train_nano.py --out OUT_DIR [--steps 1000] [--max-minutes M] [--device cuda]

The shipped checkpoint is the default run (1000 steps, about 70 s on one H200; see BENCHMARKS.md).
The corpus is only ~2.3M tokens, so longer runs memorise it: a 3212-step run reached the same
passkey skill but a held-out loss of 5.35 instead of 3.75.

Data: the stdlib corpus (salactl.data.corpus, train split) as language-modelling rows, each
`<s>` + a random window of the token stream (documents separated by `</s>`), mixed with passkey
retrieval rows (salactl.evaluation.passkey) whose loss is the answer only. Curriculum: the first
`--short-frac` of the steps use lengths up to dense_len (dense attention); after that lengths are
drawn uniformly from `--lengths`, so rows past dense_len train through the InfLLM-V2 sparse path.
Each step holds `--batch-tokens` tokens of one length. AdamW, linear warm-up then cosine decay,
fixed seeds; the config and every metric are logged as JSON lines. `--max-minutes` times one
step of each length first and caps `--steps` to fit the budget (the chosen count is logged, so
`--steps N` alone reproduces the run). Writes an HF checkpoint (bf16, sharded safetensors,
tokenizer, generation_config) to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]


def _bootstrap_imports() -> None:
    """Import `salactl.runtime` from a bare checkout (the pyproject maps runtime/ under salactl)."""
    try:
        import salactl.runtime.config  # noqa: F401
    except ModuleNotFoundError:
        sys.path.insert(0, str(REPO))
        import salactl

        salactl.__path__.append(str(REPO))


_bootstrap_imports()

from salactl.data.corpus import corpus_documents, corpus_sha256, python_version  # noqa: E402
from salactl.evaluation.passkey import answer_ids, make_passkey_prompt  # noqa: E402
from salactl.runtime.backend_train import TrainBatch, TrainingBackend  # noqa: E402
from salactl.runtime.checkpoint import random_state_dict  # noqa: E402
from salactl.runtime.checkpoint_write import save_checkpoint
from salactl.runtime.device_sync import synchronize  # noqa: E402
from salactl.runtime.loader import EMBEDDED_DIR, build_model, load_model  # noqa: E402
from salactl.runtime.presets import sala_nano  # noqa: E402
from salactl.runtime.tokenizer import Tokenizer  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")   # the device returns <= 8 files


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokenizer-dir", type=Path, default=EMBEDDED_DIR)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--max-minutes", type=float, default=None, help="cap --steps to fit this budget")
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--lengths", default="128,192,256,384,512,768,1024")
    ap.add_argument("--short-frac", type=float, default=0.1)
    ap.add_argument("--passkey-frac", type=float, default=0.35, help="share of rows that are passkey tasks")
    ap.add_argument("--passkey-weight", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--amp", choices=("auto", "bf16", "off"), default="auto")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-lengths", default="256,512,1024,2048,4096")
    ap.add_argument("--eval-trials", type=int, default=4)
    ap.add_argument("--save-every", type=int, default=0, help="also checkpoint every N steps (0 = end only)")
    ap.add_argument("--max-shard-mb", type=float, default=12.0)
    ap.add_argument("--log", type=Path, default=None, help="also append the JSON lines here")
    return ap.parse_args(argv)


class Logger:
    def __init__(self, path: Path | None):
        self.file = open(path, "a") if path else None
        self.t0 = time.time()

    def __call__(self, kind: str, **fields) -> None:
        rec = {"kind": kind, "t": round(time.time() - self.t0, 2), **fields}
        line = json.dumps(rec)
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()


# ---- data ---------------------------------------------------------------------------------
def token_stream(tok: Tokenizer, split: str, eos: int) -> torch.Tensor:
    ids: list[int] = []
    for enc in tok.tok.encode_batch(list(corpus_documents(split)), add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


class Batcher:
    """Rows of one length: LM windows first, passkey rows after; returns ids and logit targets."""

    def __init__(self, stream: torch.Tensor, tok: Tokenizer, passkey_frac: float, seed: int, device):
        self.stream, self.tok, self.frac, self.device = stream.to(device), tok, passkey_frac, device
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.bos = tok.bos_id

    def lm_rows(self, n: int, T: int) -> torch.Tensor:
        starts = torch.randint(0, len(self.stream) - T, (n,), generator=self.gen).to(self.device)
        win = self.stream[starts[:, None] + torch.arange(T - 1, device=self.device)]
        return torch.cat([torch.full((n, 1), self.bos, device=self.device, dtype=torch.long), win], 1)

    def passkey_rows(self, n: int, T: int, depths=None) -> tuple[torch.Tensor, int]:
        rows, width = [], None
        ans_len = len(answer_ids(self.tok, "0" * 5))
        for i in range(n):
            depth = self.rng.random() if depths is None else depths[i]
            prompt, key = make_passkey_prompt(self.tok, T - ans_len, depth, self.rng)
            ans = answer_ids(self.tok, key)
            assert len(ans) == ans_len
            rows.append(prompt + ans)
            width = ans_len
        return torch.tensor(rows, dtype=torch.long, device=self.device), width or 0

    def batch(self, B: int, T: int):
        n_pk = min(B, round(B * self.frac))
        lm = self.lm_rows(B - n_pk, T)
        pk, ans_len = self.passkey_rows(n_pk, T)
        return torch.cat([lm, pk]), B - n_pk, ans_len


def split_logits(model, ids: torch.Tensor, n_lm: int, ans_len: int, backend):
    """Logits only where a loss is taken: every LM position, the answer positions of passkey rows."""
    B, T = ids.shape
    tb = TrainBatch.build(model.config, B, T, backend, ids.device)
    rows = torch.arange(B * T, device=ids.device).view(B, T)
    want = [rows[:n_lm, :-1].reshape(-1), rows[n_lm:, T - 1 - ans_len:T - 1].reshape(-1)]
    logits = model(ids.view(-1), tb, logit_rows=torch.cat(want))
    lm_logits = logits[: want[0].numel()]
    pk_logits = logits[want[0].numel():].view(B - n_lm, ans_len, logits.shape[-1])
    return lm_logits, pk_logits


def losses(model, ids, n_lm, ans_len, backend):
    lm_logits, pk_logits = split_logits(model, ids, n_lm, ans_len, backend)
    out = {}
    if n_lm:
        out["lm"] = F.cross_entropy(lm_logits, ids[:n_lm, 1:].reshape(-1))
    if ids.shape[0] > n_lm:
        target = ids[n_lm:, -ans_len:]
        out["pk"] = F.cross_entropy(pk_logits.reshape(-1, pk_logits.shape[-1]), target.reshape(-1))
        digits = ans_len - 1                      # the final "." is not part of the key
        hit = (pk_logits.argmax(-1) == target)[:, :digits].all(-1)
        out["pk_acc"] = hit.float().mean()
    return out


# ---- schedule -----------------------------------------------------------------------------
def lr_at(step: int, total: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def length_choices(step: int, total: int, lengths: list[int], dense_len: int, short_frac: float):
    if step < short_frac * total:
        return [t for t in lengths if t <= dense_len] or lengths[:1]
    return lengths


# ---- evaluation ---------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, heldout: torch.Tensor, tok, args, backend, amp, lengths, trials) -> dict:
    model.eval()
    out = {}
    ev = Batcher(heldout, tok, 0.0, seed=1234, device=args.device)
    with amp():
        ids, n_lm, _ = ev.batch(16, 512)
        out["heldout_lm_loss"] = round(float(losses(model, ids, n_lm, 0, backend)["lm"]), 4)
        depths = [round(0.1 * i, 1) for i in range(1, 10)]
        for T in lengths:
            pk = Batcher(heldout, tok, 1.0, seed=99, device=args.device)
            accs = []
            for _ in range(trials):
                ids, ans_len = pk.passkey_rows(len(depths), T, depths)
                accs.append(float(losses(model, ids, 0, ans_len, backend)["pk_acc"]))
            out[f"passkey_acc_{T}"] = round(sum(accs) / len(accs), 3)
    model.train()
    return out


def calibrate(model, batcher_args, lengths, backend, amp, args, log) -> dict[int, float]:
    """Seconds per optimizer-free fwd+bwd step at each length (second of two runs)."""
    stream, tok = batcher_args
    b = Batcher(stream, tok, args.passkey_frac, seed=args.seed + 777, device=args.device)
    times = {}
    for T in lengths:
        B = max(1, args.batch_tokens // T)
        for rep in range(2):
            ids, n_lm, ans_len = b.batch(B, T)
            synchronize(args.device)
            t0 = time.perf_counter()
            with amp():
                loss = sum(v for k, v in losses(model, ids, n_lm, ans_len, backend).items() if k != "pk_acc")
            loss.backward()
            synchronize(args.device)
            times[T] = time.perf_counter() - t0
        model.zero_grad(set_to_none=True)
    log("calibrate", step_seconds={str(k): round(v, 4) for k, v in times.items()})
    return times


def expected_steps(times: dict[int, float], lengths, dense_len, args, budget_s: float) -> int:
    short = [t for t in lengths if t <= dense_len] or lengths[:1]
    mean_short = sum(times[t] for t in short) / len(short)
    mean_all = sum(times[t] for t in lengths) / len(lengths)
    per_step = (args.short_frac * mean_short + (1 - args.short_frac) * mean_all) * 1.08  # + optimizer
    return max(1, int(budget_s / per_step))


# ---- main ---------------------------------------------------------------------------------
def main(argv=None) -> None:
    args = parse_args(argv)
    log = Logger(args.log)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device = torch.device(args.device)
    use_amp = args.amp == "bf16" or (args.amp == "auto" and device.type == "cuda")
    amp = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_amp else (
        lambda: torch.autocast(device.type, enabled=False))
    lengths = sorted(int(x) for x in args.lengths.split(","))
    eval_lengths = [int(x) for x in args.eval_lengths.split(",")]

    tok = Tokenizer(args.tokenizer_dir)
    config = sala_nano(vocab_size=tok.vocab_size)
    dense_len = config.sparse_config.dense_len
    t0 = time.time()
    train_stream = token_stream(tok, "train", eos=config.eos_token_id[0])
    heldout_stream = token_stream(tok, "heldout", eos=config.eos_token_id[0])
    provenance = {
        "python": python_version(), "corpus_train_sha256": corpus_sha256("train"),
        "corpus_heldout_sha256": corpus_sha256("heldout"), "train_tokens": len(train_stream),
        "heldout_tokens": len(heldout_stream), "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
    }
    log("config", args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        model=config.to_hf_dict(), params=config.parameter_count(), amp=use_amp,
        data_seconds=round(time.time() - t0, 1), **provenance)

    state = random_state_dict(config, device, torch.float32, seed=args.seed)
    model = build_model(config, state).train().requires_grad_(True)
    backend = TrainingBackend(config)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")

    total = args.steps
    if args.max_minutes:
        times = calibrate(model, (train_stream, tok), lengths, backend, amp, args, log)
        budget = args.max_minutes * 60 - (time.time() - log.t0) - 35.0   # evals + saves
        total = min(total, expected_steps(times, lengths, dense_len, args, budget))
    log("plan", steps=total, batch_tokens=args.batch_tokens, lengths=lengths)

    batcher = Batcher(train_stream, tok, args.passkey_frac, seed=args.seed, device=device)
    pick = random.Random(args.seed + 1)
    t_train = time.time()
    tokens = 0
    for step in range(total):
        T = pick.choice(length_choices(step, total, lengths, dense_len, args.short_frac))
        B = max(1, args.batch_tokens // T)
        ids, n_lm, ans_len = batcher.batch(B, T)
        lr = lr_at(step, total, args)
        for group in opt.param_groups:
            group["lr"] = lr
        with amp():
            parts = losses(model, ids, n_lm, ans_len, backend)
        loss = parts.get("lm", 0.0) + args.passkey_weight * parts.get("pk", 0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        tokens += B * T
        if step % args.log_every == 0 or step == total - 1:
            el = time.time() - t_train
            log("train", step=step, T=T, B=B, lr=round(lr, 6), loss=round(float(loss.detach()), 4),
                **{k: round(float(v.detach()), 4) for k, v in parts.items()}, grad_norm=round(float(gnorm), 3),
                tokens=tokens, tok_per_s=round(tokens / max(el, 1e-9)), elapsed=round(el, 1))
        if args.eval_every and step and step % args.eval_every == 0:
            safe_eval(log, "eval", model, heldout_stream, tok, args, backend, amp, [256, 1024], 1, step=step)
        if args.save_every and step and step % args.save_every == 0:
            save(model, config, tok, args, provenance | {"steps": step, "seed": args.seed}, log)

    train_seconds = time.time() - t_train
    save(model, config, tok, args, provenance | {"steps": total, "seed": args.seed,
                                                 "train_seconds": round(train_seconds, 1)}, log)
    safe_eval(log, "final_eval", model, heldout_stream, tok, args, backend, amp, eval_lengths,
              args.eval_trials, steps=total, train_seconds=round(train_seconds, 1))


def safe_eval(log, kind, *eval_args, **fields) -> None:
    """Evaluation must never cost the trained weights: errors are logged, not raised."""
    try:
        log(kind, **fields, **evaluate(*eval_args))
    except Exception as e:  # noqa: BLE001
        log(kind + "_error", error=f"{type(e).__name__}: {e}", **fields)


def save(model, config, tok, args, provenance: dict, log) -> None:
    state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    cfg = config.to_hf_dict() | {"salactl_training": provenance}
    gen = {"bos_token_id": config.bos_token_id, "eos_token_id": list(config.eos_token_id),
           "pad_token_id": config.pad_token_id, "do_sample": False, "max_new_tokens": 64}
    with tempfile.TemporaryDirectory() as tmp:
        gen_file = Path(tmp) / "generation_config.json"
        gen_file.write_text(json.dumps(gen, indent=2) + "\n")
        extra = {"generation_config.json": gen_file}
        for name in TOKENIZER_FILES:
            if (args.tokenizer_dir / name).exists():
                extra[name] = args.tokenizer_dir / name
        save_checkpoint(state, cfg, args.out, max_shard_bytes=int(args.max_shard_mb * 1e6),
                        extra_files=extra, overwrite=True)
    loaded = load_model(str(args.out), "cpu", "bfloat16")       # the shipped format loads strictly
    files = {p.name: p.stat().st_size for p in sorted(args.out.iterdir())}
    log("saved", out=str(args.out), files=files, params=loaded.config.parameter_count())


if __name__ == "__main__":
    main()
