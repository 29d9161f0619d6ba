"""SGLang (`POST /generate`) and OpenAI-compatible (`POST /v1/completions`, vLLM/SGLang) servers
as bench targets, streaming server-sent events.

Hand-written on the standard library (http.client + one thread per in-flight request) rather than
httpx/aiohttp: no new dependency, every chunk is timestamped the moment its line is read (the
runner's per-token ITL needs exactly that), and Ctrl-C can unblock a read by shutting the socket.

Requests mirror SGLang's bench client: temperature 0, ignore_eos, the exact max token count,
streaming; text prompts go as text, synthetic prompts as token ids (`input_ids` for /generate, a
list of ids as `prompt` for /v1/completions). Token counts per chunk come from
`meta_info.completion_tokens` (/generate) or per-chunk usage (`stream_options.continuous_usage_stats`,
vLLM and SGLang). A server that sends no usage at all counts one token per text chunk while
streaming; at [DONE] the total is estimated by re-tokenizing the streamed text with the bench
tokenizer when there is one (vLLM's client), else the chunk count stays, marked as estimated.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from urllib.parse import urlsplit

from salactl import output
from salactl.bench.requests import BenchRequest
from salactl.bench.targets.base import Chunk, RequestFailed, Target
from salactl.errors import EndpointError, UsageError

BACKENDS = ("sglang", "openai")
_PATHS = {"sglang": ("/generate", "/flush_cache", "/health"),
          "openai": ("/v1/completions", "/reset_prefix_cache", "/v1/models")}
# full API URLs people paste as --endpoint; the server's root is what we need
_API_SUFFIXES = ("/v1/chat/completions", "/v1/completions", "/generate")
DEFAULT_READ_TIMEOUT_S = 6 * 60 * 60     # SGLang's and vLLM's bench clients: ClientTimeout(total=6 h)


def iter_sse(resp):
    """Yield (data, perf_counter) for each `data:` line of an event stream."""
    while True:
        raw = resp.readline()
        if not raw:
            return
        ts = time.perf_counter()
        line = raw.strip()
        if not line or line.startswith(b":"):
            continue
        if line.startswith(b"data:"):
            yield line[5:].strip().decode("utf-8", "replace"), ts


def _has_blank(url: str) -> bool:
    """Whitespace or control characters, which urlsplit keeps in the host but http.client refuses."""
    return any(c.isspace() or not c.isprintable() for c in url)


class HttpTarget(Target):
    def __init__(self, endpoint: str, backend: str, model: str | None = None,
                 connect_timeout_s: float = 5.0, flush_sleep_s: float = 1.0,
                 read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S, tokenizer=None):
        if backend not in BACKENDS:
            raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        bad_url = UsageError(f"--endpoint must be an http(s) URL like http://127.0.0.1:30000, got {endpoint!r}")
        try:
            parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
            port = parts.port               # parsed lazily: raises on a bad or out-of-range port
        except ValueError:
            raise bad_url from None
        if parts.scheme not in ("http", "https") or not parts.hostname or port == 0 or _has_blank(endpoint):
            raise bad_url
        self.kind, self.backend = backend, backend
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.read_timeout_s = read_timeout_s
        prefix = parts.path.rstrip("/")
        api = next((p for p in _API_SUFFIXES if prefix.endswith(p)), None)
        if api:
            prefix = prefix[:-len(api)]
        if prefix.endswith("/v1"):
            prefix = prefix[:-3]
        self.prefix = prefix
        self.url = f"{self.scheme}://{self.host}:{self.port}{prefix}"
        if api:
            output.stderr.print(f"note: --endpoint ends in {api}; using the server root {self.url} "
                                f"(--backend {backend} posts to {_PATHS[backend][0]})")
        self.tokenizer = tokenizer          # counts the output of a server that reports no usage
        self._tok_lock = threading.Lock()
        self.model = model or ""
        self.connect_timeout_s, self.flush_sleep_s = connect_timeout_s, flush_sleep_s
        self.generate_path, self.flush_path, self.probe_path = (prefix + p for p in _PATHS[backend])
        self._active: set = set()
        self._lock = threading.Lock()
        self._warned_flush = False

    # ---- connections ----------------------------------------------------------------------
    def _connect(self):
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.connect_timeout_s)
        try:
            conn.connect()
        except (OSError, http.client.HTTPException) as e:
            raise EndpointError(f"cannot reach {self.url} ({_why(e)}); start the {self.backend} server "
                                "or fix --endpoint") from None
        conn.sock.settimeout(self.read_timeout_s)
        return conn

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json"}
        key = os.environ.get("OPENAI_API_KEY")
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = self._connect()
        conn.sock.settimeout(max(self.connect_timeout_s, 30.0))
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                         headers=self._headers())
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise EndpointError(f"{self.url}{path} did not answer ({_why(e)}); check the server") from None
        finally:
            conn.close()

    # ---- Target ---------------------------------------------------------------------------
    def check(self) -> None:
        status, body = self._call("GET", self.probe_path)
        if status >= 500:
            raise EndpointError(f"{self.url}{self.probe_path} answered HTTP {status}; wait until the "
                                "server is ready")
        if self.backend == "openai" and not self.model:
            if status >= 400:
                text = " ".join(body[:200].decode("utf-8", "replace").split())
                raise EndpointError(f"{self.url}{self.probe_path} answered HTTP {status}: {text}; pass the "
                                    "API key (OPENAI_API_KEY) / check the URL")
            try:
                self.model = json.loads(body)["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise EndpointError(f"{self.url}/v1/models did not list a model; pass --model with the "
                                    "served model name") from None
        if self.backend == "sglang" and not self.model:
            try:
                status, body = self._call("GET", self.prefix + "/get_model_info")
                self.model = json.loads(body).get("model_path") or "" if status == 200 else ""
            except (EndpointError, ValueError, AttributeError):
                self.model = ""
            self.model = self.model or f"sglang@{self.host}:{self.port}"

    def _payload(self, request: BenchRequest, max_tokens: int) -> dict:
        prompt = request.prompt_text if request.prompt_text is not None else list(request.prompt_ids)
        if self.backend == "sglang":
            return {("text" if isinstance(prompt, str) else "input_ids"): prompt,
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens,
                                        "ignore_eos": True},
                    "stream": True}
        return {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}

    def stream(self, request: BenchRequest, max_tokens: int, cancel: threading.Event):
        try:
            conn = self._connect()
        except EndpointError as e:
            raise RequestFailed(str(e)) from None
        with self._lock:
            self._active.add(conn)
        try:
            if cancel.is_set():
                raise RequestFailed("cancelled")
            try:
                conn.request("POST", self.generate_path,
                             body=json.dumps(self._payload(request, max_tokens)).encode(),
                             headers=self._headers())
                resp = conn.getresponse()
                if resp.status != 200:
                    text = resp.read(300).decode("utf-8", "replace").strip()
                    raise RequestFailed(f"HTTP {resp.status} {resp.reason}: {text}")
                ctype = resp.getheader("Content-Type") or ""
                # a missing header is let through: bare-bones servers stream without one
                if ctype and ctype.split(";")[0].strip().lower() != "text/event-stream":
                    text = " ".join(resp.read(300).decode("utf-8", "replace").split())
                    raise RequestFailed(f"HTTP 200 with Content-Type {ctype}, not an event stream "
                                        f"(does the server ignore \"stream\"?): {text}")
                yield from self._chunks(iter_sse(resp), max_tokens)
            except (socket.timeout, TimeoutError):
                raise RequestFailed(f"no data from the server for {self.read_timeout_s:g} s "
                                    "(--request-timeout)") from None
            except (OSError, http.client.HTTPException) as e:
                raise RequestFailed("cancelled" if cancel.is_set() else f"connection lost ({_why(e)})") from None
        finally:
            with self._lock:
                self._active.discard(conn)
            conn.close()

    def _chunks(self, events, max_tokens: int):
        """Token chunks of one streamed response; a stream is complete only with its `[DONE]`
        (a connection closed before it is a failed request, not a short answer)."""
        last, usage_seen, texts = 0, False, []
        for data, ts in events:
            if data == "[DONE]":
                if self.backend == "openai" and last and not usage_seen:
                    yield Chunk(ts, self._estimate(texts, last), counts_only=True, estimated=True)
                return
            try:
                obj = json.loads(data)
            except ValueError:
                raise RequestFailed(f"the server streamed a line that is not JSON: {data[:100]!r}") from None
            if not isinstance(obj, dict):
                raise RequestFailed(f"the server streamed a non-object: {data[:100]!r}")
            if obj.get("error"):
                raise RequestFailed(f"server error: {str(obj['error'])[:200]}")
            if self.backend == "sglang":
                tokens = _count(_field(obj, "meta_info").get("completion_tokens", last),
                                "meta_info.completion_tokens", max_tokens)
                if tokens > last:
                    last = tokens
                    yield Chunk(ts, tokens)
                continue
            choices = obj.get("choices") or []
            text = choices[0].get("text") if choices and isinstance(choices[0], dict) else ""
            counted = _field(obj, "usage").get("completion_tokens")
            if counted is not None:
                counted = _count(counted, "usage.completion_tokens", max_tokens)
                usage_seen = True
            if text:
                if isinstance(text, str):
                    texts.append(text)
                tokens = counted if counted is not None else last + 1
                if tokens > last:
                    last = tokens
                    yield Chunk(ts, tokens)
            elif counted is not None and counted > last:   # final usage-only chunk
                last = counted
                yield Chunk(ts, last, counts_only=True)
        raise RequestFailed(f"the stream ended after {last} tokens without data: [DONE] "
                            "(the server closed the connection mid-response)")

    def _estimate(self, texts: list[str], chunks: int) -> int:
        """Output tokens of a stream without usage: the streamed text re-tokenized, else the chunk count."""
        if self.tokenizer is None or not texts:
            return chunks
        with self._tok_lock:
            return len(self.tokenizer.encode("".join(texts), add_special_tokens=False)) or chunks

    def flush_cache(self) -> None:
        status, _ = self._call("POST", self.flush_path)
        tried = [self.flush_path]
        sglang_flush = self.prefix + _PATHS["sglang"][1]
        if status == 404 and self.flush_path != sglang_flush:
            # vLLM serves /reset_prefix_cache only in dev mode; an SGLang server behind the openai
            # backend has /flush_cache instead
            status, _ = self._call("POST", sglang_flush)
            tried.append(sglang_flush)
            if status < 400:
                self.flush_path = sglang_flush
        if status >= 400 and not self._warned_flush:
            self._warned_flush = True
            output.stderr.print(f"warning: {' and '.join(self.url + p[len(self.prefix):] for p in tried)} "
                                f"answered HTTP {status}; the prefix cache was not flushed")
        if self.flush_sleep_s > 0:
            time.sleep(self.flush_sleep_s)

    def cancel_all(self) -> None:
        with self._lock:
            conns = list(self._active)
        for conn in conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except (OSError, AttributeError):
                pass

    def knobs(self) -> dict:
        return {"endpoint": self.url, "backend": self.backend, "flush_sleep_s": self.flush_sleep_s,
                "request_timeout_s": self.read_timeout_s}


def _field(obj: dict, key: str) -> dict:
    """obj[key] as a dict ({} when absent or null); anything else fails the request."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestFailed(f"the server streamed {key} = {str(value)[:60]!r}, not an object")
    return value


def _count(value, name: str, max_tokens: int) -> int:
    """A token count from the server: an integer in [0, max_tokens] (a request asks for exactly
    max_tokens with ignore_eos, so more is a server or protocol error, not throughput)."""
    whole = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer())
    if not whole:
        raise RequestFailed(f"the server streamed {name} = {str(value)[:60]!r}, not a token count")
    if not 0 <= value <= max_tokens:
        raise RequestFailed(f"the server streamed {name} = {int(value)} for max_tokens {max_tokens}")
    return int(value)


def _why(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, socket.gaierror):
        return f"unknown host: {e.strerror}"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    return f"{type(e).__name__}: {e}".rstrip(": ")
