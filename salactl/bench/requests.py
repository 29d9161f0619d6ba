"""The two records a benchmark moves around: a request to send and the client-side timing of
one request, both independent of the target (embedded engine or HTTP server)."""

from __future__ import annotations

from dataclasses import dataclass, field

ESTIMATED_SOURCES = ("tokenizer", "chunks")
RETOKENIZE_SLACK = 0.02         # how far a re-tokenized count may fall below the generated one


@dataclass(frozen=True)
class BenchRequest:
    """One request of a phase. `prompt_ids` is always set when the lengths are exact (synthetic
    data, or text tokenized client-side); `prompt_text` is set for text datasets (SOAR rows)."""

    request_id: str
    input_len: int
    output_len: int
    prompt_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    source_line: int | None = None      # line number in the dataset file, for messages

@dataclass
class RequestResult:
    """Client-side timestamps of one request, as SGLang's `RequestFuncOutput` keeps them:
    `ttft` and `latency` in seconds from `start_time` (perf_counter at send), `itl` one entry per
    token after the first chunk (a chunk's gap is spread evenly over the tokens it carries)."""

    request_id: str
    phase: str
    input_len: int
    expected_output_len: int
    start_time: float = 0.0
    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    output_len: int = 0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    # who counted output_len: the target's own count ("usage" from a server, "engine"), or the
    # client's estimate for a server that sent none ("tokenizer" = re-tokenized text, "chunks")
    output_len_source: str = "usage"
    output_len_over_max: int | None = None  # an estimate above max_tokens (output_len was capped)
    # what made it fail, where it was an exception (the embedded runtime's SalactlError keeps its
    # exit code through bench's warmup); not part of any record
    failure: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def output_len_estimated(self) -> bool:
        """The server reported no token count; output_len is ours."""
        return self.output_len_source in ESTIMATED_SOURCES

    @property
    def short(self) -> bool:
        """Succeeded with fewer tokens than asked: by the target's own count, or clearly fewer by
        re-tokenizing the streamed text, which can merge or split a token where the generated ids
        did not decode to their own canonical encoding (so the larger of 1 token and 2% is let
        pass). A chunk count tells nothing: one chunk may carry several tokens."""
        if not self.success or self.output_len_source == "chunks":
            return False
        slack = max(1.0, RETOKENIZE_SLACK * self.expected_output_len) if self.output_len_estimated else 0
        return self.output_len < self.expected_output_len - slack

    @property
    def tpot(self) -> float | None:
        """(E2E − TTFT) / (output_len − 1); None for ≤ 1 output token (SGLang skips those)."""
        if not self.success or self.output_len <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)
