"""Per-request sampling parameters and the sampler: HF generate()'s logits processors (repetition
penalty, no-repeat n-grams, min_new_tokens) on the raw logits, then greedy, or its warpers
(temperature, top-k, top-p, min-p) and a draw."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from salactl.errors import AllTokensBannedError, NumericsError, UsageError

NON_FINITE = ("the model computed NaN/Inf logits: its weights hold NaN/Inf, or the activations "
              "overflowed the dtype; check the checkpoint, or, if it runs in float16, use --dtype "
              "bfloat16 or float32")


class PenaltyOverflowError(AllTokensBannedError):
    """A repetition penalty so near 0 that a penalised logit overflowed to +inf. Like an
    AllTokensBannedError the request's settings are wrong, not the model (a UsageError), and so a
    GPUEngine fails that request alone (its ROW_FAILURES)."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (`salactl run`'s sampling flags, as Python arguments).

    max_new_tokens: tokens to generate at most (0 = prefill only). temperature: 0 = greedy,
    else softmax temperature (one too small for fp32 draws as its limit does: among the top
    logits, greedy unless they tie). top_p: nucleus mass in (0, 1] (1 = off). top_k: keep the k
    most likely tokens (0 = off). top_p/top_k apply only when temperature > 0. seed: a sampled
    request draws from its own generator seeded with `seed`; None means 0, so unseeded requests
    are reproducible, not random. stop_token_ids: extra ids that end generation (token ids, not
    strings; an int or an iterable, stored as a tuple). ignore_eos: True runs to max_new_tokens
    past the model's and tokenizer's EOS ids (stop_token_ids still apply).

    As HF generate()'s logits processors, greedy or not, on the raw logits: repetition_penalty
    (> 0, 1 = off) divides the positive logits of every id in the prompt or the output so far and
    multiplies the negative ones; no_repeat_ngram_size (0 = off) bans each token that would repeat
    an n-gram of the prompt and output; min_new_tokens: until that many tokens are out, the ending
    ids (EOS unless ignore_eos, and stop_token_ids) cannot be sampled (more than max_new_tokens is
    allowed: no EOS then); GeneratedText(min_new_tokens=...) holds the stop strings back likewise.
    min_p in [0, 1] (0 = off): when sampling, after top_p, drop the tokens less likely than min_p
    times the most likely one. Bad values raise UsageError."""

    max_new_tokens: int = 64
    temperature: float = 0.0          # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                    # 0 = off
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float = 1.0   # 1 = off
    no_repeat_ngram_size: int = 0     # 0 = off
    min_new_tokens: int = 0
    min_p: float = 0.0                # 0 = off

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "top_k", "seed", "no_repeat_ngram_size", "min_new_tokens"):
            value = getattr(self, name)
            if not (value is None and name == "seed") and not is_int(value):    # numpy ints pass
                raise UsageError(f"{_arg(name)} must be an integer, got {value!r}")
        for name in ("temperature", "top_p", "repetition_penalty", "min_p"):
            object.__setattr__(self, name, as_float(name, getattr(self, name)))
        self._check_processors()
        if self.max_new_tokens < 0:
            raise UsageError(f"{_arg('max_new_tokens')} must be >= 0, got {self.max_new_tokens}")
        if not 0 <= self.temperature < math.inf:
            raise UsageError(f"{_arg('temperature')} must be a finite number >= 0 (0 = greedy), "
                             f"got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"{_arg('top_p')} must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UsageError(f"{_arg('top_k')} must be >= 0 (0 = off), got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise UsageError(f"{_arg('seed')} must be in [0, 2^63), got {self.seed}")
        if not isinstance(self.ignore_eos, bool):
            raise UsageError(f"{_arg('ignore_eos')} must be True or False, got {self.ignore_eos!r}")
        object.__setattr__(self, "stop_token_ids", as_token_ids(self.stop_token_ids, "stop_token_ids"))

    def _check_processors(self) -> None:
        if not 0 < self.repetition_penalty < math.inf:
            raise UsageError(f"{_arg('repetition_penalty')} must be a finite number > 0 (1 = off), "
                             f"got {self.repetition_penalty}")
        for name in ("no_repeat_ngram_size", "min_new_tokens"):
            if getattr(self, name) < 0:
                raise UsageError(f"{_arg(name)} must be >= 0 (0 = off), got {getattr(self, name)}")
        if not 0.0 <= self.min_p <= 1.0:
            raise UsageError(f"{_arg('min_p')} must be in [0, 1] (0 = off), got {self.min_p}")

    @property
    def has_processors(self) -> bool:
        """Whether a logits processor is on (then even greedy decoding samples row by row)."""
        return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0 or self.min_new_tokens > 0


def as_float(name: str, value) -> float:
    """A real number (a Fraction, a numpy float, an int) as a float; anything else (a bool, text) is a
    UsageError naming the argument `name` and its flag."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"{_arg(name)} must be a number, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise UsageError(f"{_arg(name)} must be a number a float can hold (within ±1.8e308), got one "
                         "past it") from None


def _arg(name: str) -> str:
    """A field as the Python argument and the CLI flag: `max_new_tokens (--max-new-tokens)`."""
    return f"{name} (--{name.replace('_', '-')})"


def is_int(value) -> bool:
    """An integer (numpy ints included), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


_NOT_TEXT = "stop strings are not token ids"


def as_token_ids(value, what: str) -> tuple[int, ...]:
    """An int, an iterable of ints, a 0-D or 1-D integer tensor / array or None (= none) as a tuple
    of ints; anything else, text and negative ids above all, is a UsageError naming `what`. The
    upper bound is the model's vocabulary, checked where the model is known (the engines)."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)):
        raise UsageError(f"{what} got text {value!r}: {_NOT_TEXT}; pass token ids (Tokenizer.encode gives "
                         "them), or the text as GeneratedText(stop=...) (`run --stop`)")
    if hasattr(value, "tolist") and hasattr(value, "ndim"):      # torch tensor, numpy array (as prompts)
        if value.ndim > 1:
            raise UsageError(f"{what} as a tensor must be 1-D (or 0-D), got shape {tuple(value.shape)}")
        value = value.tolist()          # float / bool elements stay floats / bools: refused below
    try:
        items = [value] if is_int(value) else list(value)
    except TypeError:
        raise UsageError(f"{what} must be a token id or an iterable of token ids, got {value!r}") from None
    bad = [t for t in items if not is_int(t)]
    if bad:
        hint = f"; {_NOT_TEXT}; pass token ids, or the text as GeneratedText(stop=...)" \
            if isinstance(bad[0], str) else ""
        raise UsageError(f"{what} must hold integer token ids, got {bad[0]!r}{hint}")
    negative = [t for t in items if t < 0]
    if negative:
        raise UsageError(f"{what} must hold token ids >= 0, got {negative[0]}")
    return tuple(int(t) for t in items)


def resolve_params(params) -> SamplingParams:
    """`params` as given, or the defaults for None; anything but a SamplingParams is a UsageError."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise UsageError(f"params must be a SamplingParams, got {type(params).__name__} "
                         "(e.g. SamplingParams(max_new_tokens=32))")
    return params


def greedy(logits: torch.Tensor) -> list[int]:
    """The argmax of each row of logits [n, V], in one device sync; NaN/Inf logits are an error
    (an argmax over them would silently repeat one token)."""
    top = logits.max(dim=-1)
    values, ids = torch.stack([top.values.float(), top.indices.float()]).tolist()  # ids < 2^24: exact
    if not all(math.isfinite(v) for v in values):
        raise NumericsError(NON_FINITE)
    return [int(i) for i in ids]


class _NGramBans:
    """HF NoRepeatNGramLogitsProcessor, kept incrementally: each (n-1)-gram of the ids so far maps
    to the tokens that followed it."""

    def __init__(self, n: int, ids: list[int]):
        self.n, self.ids, self.next = n, [], {}
        for t in ids:
            self.append(t)

    def append(self, token: int) -> None:
        self.ids.append(token)
        if len(self.ids) >= self.n:
            self.next.setdefault(tuple(self.ids[len(self.ids) - self.n:-1]), set()).add(token)

    def banned(self) -> set[int]:
        if len(self.ids) + 1 < self.n:
            return set()
        return self.next.get(tuple(self.ids[len(self.ids) - self.n + 1:]), set())


class LogitsProcessors:
    """One request's state for HF generate()'s logits processors, in HF's order: repetition
    penalty, no-repeat n-grams, min_new_tokens. Made by logits_processors(); told each sampled
    token by sample()."""

    def __init__(self, params: SamplingParams, prompt: list[int], ending_ids, vocab_size: int,
                 device: torch.device):
        self.params, self.generated = params, 0
        self.seen = None
        if params.repetition_penalty != 1.0:     # a mask, not a gather over the whole history per step
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.seen[torch.tensor(prompt, dtype=torch.long, device=device)] = True
        self.ngrams = _NGramBans(params.no_repeat_ngram_size, prompt) if params.no_repeat_ngram_size else None
        self.ending = sorted(ending_ids)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] with the processors applied (a new tensor)."""
        p = self.params
        if self.seen is not None:
            penalised = torch.where(logits < 0, logits * p.repetition_penalty, logits / p.repetition_penalty)
            logits = torch.where(self.seen, penalised, logits)
        banned = sorted(self.ngrams.banned()) if self.ngrams is not None else []
        if self.generated < p.min_new_tokens:
            banned += self.ending
        if banned:
            logits = logits.index_fill(0, torch.tensor(banned, dtype=torch.long, device=logits.device),
                                       float("-inf"))
        return logits

    def settings_error(self, kept: torch.Tensor) -> AllTokensBannedError:
        """Why the processed logits `kept` leave no token to draw though the model's were finite."""
        if float(kept.max()) == -math.inf:
            return AllTokensBannedError(self.all_banned())
        # only the penalty makes +inf: a positive logit divided by a penalty near 0
        dtype = str(kept.dtype).removeprefix("torch.")
        return PenaltyOverflowError(
            f"{_arg('repetition_penalty')} {self.params.repetition_penalty} divides a positive logit past "
            f"{dtype}'s range (to inf) at output token {self.generated + 1}; use a penalty nearer 1 (1 = off)")

    def all_banned(self) -> str:
        """Why every token is banned before the next one (AllTokensBannedError's message)."""
        p, why = self.params, []
        repeats = len(self.ngrams.banned()) if self.ngrams is not None else 0
        if repeats:
            why.append(f"{_arg('no_repeat_ngram_size')} {p.no_repeat_ngram_size} bans the {repeats} ids "
                       "that would repeat an n-gram")
        if self.generated < p.min_new_tokens:
            why.append(f"{_arg('min_new_tokens')} {p.min_new_tokens} holds back the ending ids (EOS, stop ids)")
        if not why:          # only the penalty is left to have pushed the logits to -inf
            why.append(f"{_arg('repetition_penalty')} {p.repetition_penalty} scales every logit to -inf")
        return (f"every token was banned by the logits processors at output token {self.generated + 1}: "
                f"{' and '.join(why)}; lower or turn off one of these settings")

    def append(self, token: int) -> None:
        self.generated += 1
        if self.seen is not None:
            self.seen[token] = True
        if self.ngrams is not None:
            self.ngrams.append(token)


def logits_processors(params: SamplingParams, prompt: list[int], ending_ids, vocab_size: int,
                      device: torch.device) -> LogitsProcessors | None:
    """The request's LogitsProcessors; None when none is on (a request then costs nothing more).
    ending_ids: the ids min_new_tokens holds back (the request's EOS and stop ids)."""
    if not params.has_processors:
        return None
    return LogitsProcessors(params, prompt, ending_ids, vocab_size, device)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
           processors: LogitsProcessors | None = None) -> int:
    """logits: fp32 [V] for one sequence. processors: the request's (logits_processors()), applied
    first and told the token sampled. NaN/Inf logits are a NumericsError; finite ones the processors
    banned entirely are an AllTokensBannedError, or pushed to +inf (a repetition penalty near 0) its
    subclass PenaltyOverflowError."""
    if processors is None:
        return _warp_and_draw(logits, params, generator)
    kept = processors(logits)
    try:
        tok = _warp_and_draw(kept, params, generator)
    except NumericsError:
        if math.isfinite(float(logits.max())):      # no NaN/Inf from the model: the processors made them
            raise processors.settings_error(kept) from None
        raise
    processors.append(tok)
    return tok


def _warp_and_draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Greedy, or HF's warpers (temperature, top-k, top-p, min-p) and a draw."""
    if params.temperature == 0.0:
        return greedy(logits[None])[0]
    top = logits.max()
    if not math.isfinite(float(top)):
        raise NumericsError(NON_FINITE)
    shifted = logits.float() - top      # shifted first: a tiny temperature gives -inf, not inf - inf
    # the top logits stay 0, as at any temperature: one that underflows fp32 would make them 0/0 (NaN)
    logits = torch.where(shifted == 0, shifted, shifted / params.temperature)
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        # HF's TopPLogitsWarper to the bit: the same ascending torch.sort (so tied logits at the cut
        # go the way HF's go), drop while the cumulative mass is <= 1 - top_p, keep the top token
        sorted_logits, order = torch.sort(logits, descending=False)
        drop = torch.softmax(sorted_logits, dim=-1).cumsum(-1) <= 1 - params.top_p
        drop[-1] = False
        logits = logits.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0.0:
        # HF's MinPLogitsWarper: its top token always stays (min_p <= 1), so renormalising is all
        probs = torch.softmax(logits.masked_fill(probs < params.min_p * probs.max(), float("-inf")), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
