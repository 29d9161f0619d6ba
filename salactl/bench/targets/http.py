"""SGLang (`POST /generate`) and OpenAI-compatible (`POST /v1/completions`, vLLM/SGLang) servers
as bench targets, streaming server-sent events. Backend `vllm` names a vLLM server, which speaks the
openai protocol; records keep both names (knobs.target.backend and .protocol).

Hand-written on the standard library (http.client + one client thread per in-flight request) rather than
httpx/aiohttp: no new dependency, every chunk is timestamped the moment its line is read (the
runner's per-token ITL needs exactly that), and Ctrl-C can unblock a read by shutting the socket.

Requests mirror SGLang's bench client: temperature 0, ignore_eos, the exact max token count,
streaming; text prompts go as text, synthetic prompts as token ids (`input_ids` for /generate, a
list of ids as `prompt` for /v1/completions); the streams' token counts are http_protocol.py's.
A stream ends at `data: [DONE]` or at the end of a body whose framing (its last
chunk, its Content-Length) says it is whole, as the reference clients count it; a connection cut
before either fails the request.

`--request-timeout` is a total per request, as aiohttp's ClientTimeout(total=...) in SGLang's and
vLLM's clients: every socket read waits at most the time left, and a watchdog shuts the socket down
when it passes while the status line and headers are read (http.client reads those line by line and
skips any number of interim `100 Continue` answers), so neither keep-alive comments, endless interim
answers nor a trickle can hold a request, or a side request within its cap, open past it.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import re
import socket
import ssl
import threading
import time
from urllib.parse import quote, urlsplit

try:
    import resource                 # the open-file limit an EMFILE names; imported before one can happen
except ImportError:                 # Windows
    resource = None

from salactl import output
from salactl.bench.requests import BenchRequest
from salactl.bench.targets.base import Chunk, RequestFailed, Target
from salactl.bench.targets.http_protocol import iter_sse, openai_chunks, sglang_chunks
from salactl.bench.targets.watchdog import Watchdog
from salactl.errors import CapacityError, EndpointError, SalactlError, UsageError
from salactl.input_files import lone_surrogate

BACKENDS = ("sglang", "openai", "vllm")
PROTOCOLS = {"sglang": "sglang", "openai": "openai", "vllm": "openai"}     # backend -> the API it speaks
_PATHS = {"sglang": ("/generate", "/flush_cache", "/health"),
          "openai": ("/v1/completions", "/reset_prefix_cache", "/v1/models")}
# full API URLs people paste as --endpoint; the server's root is what we need
_API_SUFFIXES = ("/v1/chat/completions", "/v1/completions", "/generate")
DEFAULT_READ_TIMEOUT_S = 6 * 60 * 60     # SGLang's and vLLM's bench clients: ClientTimeout(total=6 h)
SIDE_CALL_TIMEOUT_S = 30.0               # the probe and the cache flush, capped by --request-timeout
SIDE_CALL_MAX_BODY = 2 ** 20             # a probe's or flush's answer is a few bytes; an endless one is cut
# the longest socket wait every platform takes (poll's int milliseconds: 24.8 days); a longer
# --request-timeout is clamped to it rather than overflowing the socket's timeout
MAX_DEADLINE_S = (2 ** 31 - 1) // 1000
READ_BLOCK = 64 * 1024


class Deadline:
    """A total time limit over many socket reads (None: no limit)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds if seconds is None or seconds <= MAX_DEADLINE_S else MAX_DEADLINE_S
        self.end = None if self.seconds is None else time.monotonic() + self.seconds

    def left(self) -> float | None:
        """The seconds left (None: no limit); raise TimeoutError when none are."""
        if self.end is None:
            return None
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left

    def arm(self, sock) -> None:
        """Let the next read on `sock` wait at most the time left; raise TimeoutError when none is."""
        if sock.fileno() < 0:
            return                  # the response closed it at its body's end (Python 3.12.x/3.13)
        sock.settimeout(self.left())


class Body:
    """A response body read block by block, each read waiting at most the deadline's time left.
    Once a read returns b"" (`ended`), `whole` tells whether the body's framing said it was complete
    (its last chunk came, or all of its Content-Length) or the connection was cut; a body that only
    the connection's close ends has no framing to tell by, so it never counts as whole."""

    def __init__(self, resp, sock, deadline: Deadline):
        self.resp, self.sock, self.deadline = resp, sock, deadline
        self.ended = self.whole = False

    def read(self) -> bytes:
        self.deadline.arm(self.sock)
        try:
            block = self.resp.read1(READ_BLOCK)
        except http.client.IncompleteRead:      # cut: the stream parser says what was missing
            block = b""
        else:
            self.whole = not block and (bool(self.resp.chunked) or self.resp.length == 0)
        self.ended = not block
        return block

    def read_all(self, cap: int) -> bytes | None:
        """The rest of the body (what came, if it was cut); None once it runs past `cap` bytes."""
        blocks, size = [], 0
        while block := self.read():
            size += len(block)
            if size > cap:
                return None
            blocks.append(block)
        return b"".join(blocks)


# what a URL path keeps unescaped: "/", "%" (an escape the user typed is sent as typed), RFC 3986's
# sub-delims and the other pchar characters; quote() keeps the unreserved ones
_PATH_SAFE = "/%!$&'()*+,;=:@"
_STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _path_for_wire(path: str) -> str:
    """`path` as an HTTP request target takes it (ASCII): non-ASCII characters as their UTF-8
    %XX escapes, a '%' that starts no escape as %25; escapes already typed stay as they are."""
    return quote(_STRAY_PERCENT.sub("%25", path), safe=_PATH_SAFE)


def _host_for_wire(host: str, endpoint: str) -> str:
    """The ASCII name to connect to: a non-ASCII host as its IDNA (xn--) form, where that form
    names the same host back; Python's IDNA 2003 codec maps some names to others (straße.de to
    strasse.de, which IDNA 2008 does not), and connecting there would bench another server."""
    if host.isascii():
        return host
    try:
        wire = host.encode("idna").decode("ascii")
        clean = wire.encode("ascii").decode("idna") == host
    except UnicodeError:
        clean = False
    if not clean:
        raise UsageError(f"--endpoint host {host!r} has no clean IDNA (ASCII) form, got {endpoint!r}; "
                         "pass the host's xn-- name or its IP address")
    return wire


def _has_blank(url: str) -> bool:
    """Whitespace or control characters, which urlsplit keeps in the host but http.client refuses."""
    return any(c.isspace() or not c.isprintable() for c in url)


def api_key_header() -> dict:
    """The Authorization header from OPENAI_API_KEY ({} when unset); a value that cannot be an HTTP
    header (a pasted newline, a non-latin-1 character) is a usage error before any request."""
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        return {}
    bad = next((c for c in key if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise UsageError(f"OPENAI_API_KEY contains the control character {bad!r} (a key file with a line "
                         "ending?); strip it from the value")
    bad = next((c for c in key if ord(c) > 255), None)
    if bad is not None:
        raise UsageError(f"OPENAI_API_KEY contains {bad!r}, which an HTTP header cannot carry (latin-1 only); "
                         "check the value")
    return {"Authorization": f"Bearer {key}"}


def _refuse_userinfo(netloc: str) -> None:
    """`user:password@` in --endpoint: SGLang and vLLM take their --api-key as a Bearer token, never
    from URL credentials, so they would be dropped silently; the message does not echo them."""
    if "@" in netloc:
        raise UsageError("--endpoint carries credentials (user:password@host), which salactl does not "
                         "send; drop them and set OPENAI_API_KEY to the server's API key (sent as "
                         "Authorization: Bearer, what SGLang's and vLLM's --api-key check)")


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HttpTarget(Target):
    count_source = "usage"

    def __init__(self, endpoint: str, backend: str, model: str | None = None,
                 connect_timeout_s: float = 5.0, flush_sleep_s: float = 1.0,
                 read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S, tokenizer=None):
        if backend not in BACKENDS:
            raise UsageError(f"--backend must be one of {', '.join(BACKENDS)} (vllm: the openai protocol), "
                             f"got {backend!r}")
        bad_url = UsageError(f"--endpoint must be an http(s) URL like http://127.0.0.1:30000, got {endpoint!r}")
        try:
            parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
            _refuse_userinfo(parts.netloc)
            port = parts.port               # parsed lazily: raises on a bad or out-of-range port
        except ValueError:
            raise bad_url from None
        if parts.scheme not in ("http", "https") or not parts.hostname or port == 0 or _has_blank(endpoint):
            raise bad_url
        if parts.query or parts.fragment:
            raise UsageError(f"--endpoint must be the server's URL without a query string or fragment, got "
                             f"{endpoint!r}; drop the part from '?' or '#' on")
        self._auth = api_key_header()
        self.kind, self.backend, self.protocol = backend, backend, PROTOCOLS[backend]
        self.scheme, self.host = parts.scheme, parts.hostname
        self.connect_host = _host_for_wire(parts.hostname, endpoint)
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.read_timeout_s = read_timeout_s
        prefix = parts.path.rstrip("/")
        api = next((p for p in _API_SUFFIXES if prefix.endswith(p)), None)
        if api:
            prefix = prefix[:-len(api)]
        if prefix.endswith("/v1"):
            prefix = prefix[:-3]
        self.prefix = _path_for_wire(prefix)        # every request path starts with it
        self.origin = f"{self.scheme}://{_netloc(self.host, self.port)}"
        self.url = self.origin + prefix             # the path as typed: what records and messages show
        if api:
            output.stderr.print(f"note: --endpoint ends in {api}; using the server root {self.url} "
                                f"(--backend {backend} posts to {_PATHS[self.protocol][0]})")
        self.tokenizer = tokenizer          # counts the output of a server that reports no usage
        self._tok_lock = threading.Lock()
        self.model = model or ""
        self.connect_timeout_s, self.flush_sleep_s = connect_timeout_s, flush_sleep_s
        self.side_call_timeout_s = min(SIDE_CALL_TIMEOUT_S, read_timeout_s or SIDE_CALL_TIMEOUT_S)
        self.generate_path, self.flush_path, self.probe_path = (self.prefix + p for p in _PATHS[self.protocol])
        self._active: set = set()
        self._lock = threading.Lock()
        self._warned_flush = False
        self._watchdog = Watchdog()

    # ---- connections ----------------------------------------------------------------------
    def _connect(self, timeout_s: float | None):
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        timeout = min(self.connect_timeout_s, timeout_s or self.connect_timeout_s)
        conn = cls(self.connect_host, self.port, timeout=timeout)
        try:
            conn.connect()
        except ssl.SSLCertVerificationError as e:       # an SSLError, but no sign of a plain-HTTP port
            raise EndpointError(f"cannot reach {self.url}: its TLS certificate is not trusted "
                                f"({e.verify_message}); if a private CA signed it, set SSL_CERT_FILE to "
                                "that CA's bundle") from None
        except (OSError, http.client.HTTPException) as e:
            if (limit := _local_limit(e)) is not None:
                raise CapacityError(f"cannot open a connection to {self.url}: {limit}") from None
            raise EndpointError(f"cannot reach {self.url} ({_why(e)}); start the {self.backend} server "
                                f"or fix --endpoint{self._plain_http_hint(e)}") from None
        return conn

    def _plain_http_hint(self, e: BaseException) -> str:
        """https:// to a plain-HTTP port fails the TLS handshake, or hangs on a server awaiting a request."""
        if self.scheme == "https" and isinstance(e, (ssl.SSLError, socket.timeout, TimeoutError)):
            return f" (if the server speaks plain HTTP, use http://{_netloc(self.host, self.port)})"
        return ""

    def _headers(self) -> dict:
        return {"Content-Type": "application/json", "Accept-Encoding": "identity", **self._auth}

    def _send(self, conn, deadline: Deadline, method: str, path: str, body: dict | None):
        """Send one request and read the status line and headers, within `deadline`."""
        watch, resp = self._watchdog.watch(conn.sock, deadline), None
        try:
            deadline.arm(conn.sock)
            conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                         headers=self._headers())
            deadline.arm(conn.sock)
            resp = conn.getresponse()
        finally:
            # the shut socket's error, or headers it cut short (they may still parse), are the deadline's
            if self._watchdog.stop(watch):
                if resp is not None:
                    resp.close()
                raise TimeoutError("deadline passed")
        return resp

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        """A side request (probe, flush) within min(30 s, --request-timeout), its answer within 1 MiB.
        A redirect is an EndpointError: it is no answer (a flush redirected did not flush), and the
        generation requests, which are not followed either, would fail the same way."""
        deadline = Deadline(self.side_call_timeout_s)
        conn = self._connect(deadline.seconds)
        sock = conn.sock
        try:
            resp = self._send(conn, deadline, method, path, body)
            if 300 <= resp.status < 400:
                raise EndpointError(f"{method} {self.origin}{path} answered HTTP {resp.status} {resp.reason}"
                                    f"{_redirect_note(resp) or '; check --endpoint'}")
            answer = Body(resp, sock, deadline).read_all(SIDE_CALL_MAX_BODY)
            if answer is None:
                raise EndpointError(f"{method} {self.origin}{path} answered with more than "
                                    f"{SIDE_CALL_MAX_BODY // 2 ** 20} MiB (the cap on a probe's or cache "
                                    "flush's answer); check --endpoint and the server")
            return resp.status, answer
        except (socket.timeout, TimeoutError):
            raise EndpointError(f"{method} {self.origin}{path} did not answer within {deadline.seconds:g} s; "
                                "check the server (side requests wait min(30 s, --request-timeout))") from None
        except (OSError, http.client.HTTPException) as e:
            raise EndpointError(f"{method} {self.origin}{path} did not answer ({_why(e)}); check the server"
                                f"{self._plain_http_hint(e)}") from None
        finally:
            conn.close()

    # ---- Target ---------------------------------------------------------------------------
    def check(self) -> None:
        status, body = self._call("GET", self.probe_path)
        if status >= 500:
            raise EndpointError(f"{self.origin}{self.probe_path} answered HTTP {status}; wait until the "
                                "server is ready")
        if self.protocol == "openai" and not self.model:
            self.model = self._listed_model(status, body)
        if self.protocol == "sglang":
            self._check_sglang()

    def _check_sglang(self) -> None:
        """The model from /get_model_info. A server without that route that lists /v1/models is an
        OpenAI-compatible one (vLLM serves /health too, then answers every /generate with 404)."""
        info = self.prefix + "/get_model_info"
        try:
            status, body = self._call("GET", info)
        except EndpointError:
            status, body = None, b""
        if status == 404 and self._answers(self.prefix + _PATHS["openai"][2]):
            raise EndpointError(f"{self.origin}{info} answered HTTP 404 and {self.origin}{self.prefix}"
                                "/v1/models lists models: this looks like an OpenAI-compatible (vLLM) "
                                "server: pass --backend vllm")
        default = f"sglang@{_netloc(self.host, self.port)}"
        self.model = self.model or self._model_path(info, status, body, default) or default

    def _model_path(self, info: str, status: int | None, body: bytes, default: str) -> str:
        """/get_model_info's model_path; "" where there is none, and (with a warning) where it is no
        name: the records' model must be a string of Unicode text."""
        try:
            found = json.loads(body).get("model_path") if status == 200 else None
        except (ValueError, AttributeError, RecursionError):
            return ""
        if found in (None, "") or _is_name(found):
            return found or ""
        output.warn_once(f"{self.origin}{info} answered model_path = {_json_kind(found)}, not a model name; "
                         f"the records name the model {default} (pass --model to name it)")
        return ""

    def _answers(self, path: str) -> bool:
        """Whether GET `path` answers HTTP 200 (no answer is a no)."""
        try:
            return self._call("GET", path)[0] == 200
        except EndpointError:
            return False

    def _listed_model(self, status: int, body: bytes) -> str:
        where = f"{self.origin}{self.probe_path}"
        if status >= 400:
            text = " ".join(body[:200].decode("utf-8", "replace").split())
            fix = _listing_refused_fix(status)
            raise EndpointError(f"{where} answered HTTP {status}: {text}; {fix}")
        fix = "pass --model with the served model name"
        try:
            found = json.loads(body)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            raise EndpointError(f"{where} did not list a model; {fix}") from None
        if not _is_name(found):         # requests and records name the model with it
            raise EndpointError(f"{where} lists data[0].id = {_json_kind(found)}, not a model name; {fix}")
        return found

    def _payload(self, request: BenchRequest, max_tokens: int) -> dict:
        prompt = request.prompt_text if request.prompt_text is not None else list(request.prompt_ids)
        if self.protocol == "sglang":
            return {("text" if isinstance(prompt, str) else "input_ids"): prompt,
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens,
                                        "ignore_eos": True},
                    "stream": True}
        return {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}

    def stream(self, request: BenchRequest, max_tokens: int, cancel: threading.Event):
        if cancel.is_set():
            raise RequestFailed("cancelled")
        deadline = Deadline(self.read_timeout_s)
        try:
            conn = self._connect(deadline.seconds)
        except SalactlError as e:      # kept as the cause: a CapacityError is this machine's, not the server's
            raise RequestFailed(str(e)) from e
        sock = conn.sock                    # http.client drops conn.sock once a response will close
        with self._lock:
            self._active.add(sock)
        resp = None
        try:
            if cancel.is_set():         # set while connecting: cancel_all did not see this socket
                raise RequestFailed("cancelled")
            try:
                resp = self._send(conn, deadline, "POST", self.generate_path, self._payload(request, max_tokens))
                self._check_stream_response(resp)
                body = Body(resp, sock, deadline)
                events = self._events(iter_sse(body.read), body)
                if self.protocol == "sglang":
                    yield from sglang_chunks(events, max_tokens)
                else:
                    yield from openai_chunks(events, max_tokens, self._estimate)
            except (socket.timeout, TimeoutError):
                raise RequestFailed(f"no complete answer within {deadline.seconds:g} s (--request-timeout, "
                                    "the total time one request may take)") from None
            except (OSError, http.client.HTTPException) as e:
                raise RequestFailed("cancelled" if cancel.is_set() else f"connection lost ({_why(e)})") from None
        finally:
            with self._lock:
                self._active.discard(sock)
            if resp is not None:
                resp.close()
            conn.close()

    def _check_stream_response(self, resp) -> None:
        """A 200 event stream, not compressed; anything else fails the request with what came back."""
        where = f"POST {self.origin}{self.generate_path}"
        if resp.status != 200:
            text = " ".join(resp.read(300).decode("utf-8", "replace").split())
            to = _redirect_note(resp) if 300 <= resp.status < 400 else ""
            raise RequestFailed(f"HTTP {resp.status} {resp.reason}{': ' + text if text else ''} ({where}{to})")
        encoding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise RequestFailed(f"the server sent a {encoding}-compressed stream although the request asked "
                                "for Accept-Encoding: identity; turn compression off (server or proxy)")
        ctype = resp.getheader("Content-Type") or ""
        # a missing header is let through: bare-bones servers stream without one
        if ctype and ctype.split(";")[0].strip().lower() != "text/event-stream":
            text = " ".join(resp.read(300).decode("utf-8", "replace").split())
            raise RequestFailed(f"HTTP 200 with Content-Type {ctype}, not an event stream "
                                f"(does the server ignore \"stream\"?): {text}")

    @staticmethod
    def _events(events, body: Body):
        """The JSON objects of a stream up to its end (then None, with its timestamp): `[DONE]`, or
        a body that ended whole without it (SGLang's and vLLM's clients count a request done when its
        body ends); a connection cut before either just stops, and the parser fails the request."""
        for data, ts in events:
            if data == "[DONE]":
                yield None, ts
                return
            try:
                obj = json.loads(data)
            except (ValueError, RecursionError):       # RecursionError: nested too deep to decode
                if body.ended and not body.whole:
                    return                      # the line the cut broke off: the parser says it was cut
                raise RequestFailed(f"the server streamed a line that is not JSON: {data[:100]!r}") from None
            if not isinstance(obj, dict):
                raise RequestFailed(f"the server streamed a non-object: {data[:100]!r}")
            if obj.get("error"):
                raise RequestFailed(f"server error: {str(obj['error'])[:200]}")
            if obj.get("object") == "error":            # vLLM's ErrorResponse, streamed flat
                raise RequestFailed(f"server error: {str(obj.get('message') or obj)[:200]}")
            yield obj, ts
        if body.whole:
            yield None, time.perf_counter()

    def _estimate(self, ts: float, texts: list[str], n_chunks: int, max_tokens: int) -> Chunk:
        """Output tokens of a stream without usage: the streamed text re-tokenized, else the chunk
        count; capped at max_tokens (a request never asks for more), flagged when it was above."""
        by, n = "chunks", n_chunks
        if self.tokenizer is not None and texts:
            # a JSON "\ud83d" escape brings a lone surrogate, which no tokenizer encodes: a pair split
            # across two chunks joins up again here, a lone half becomes U+FFFD
            text = "".join(texts).encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            with self._tok_lock:
                retokenized = len(self.tokenizer.encode(text, add_special_tokens=False))
            if retokenized:
                by, n = "tokenizer", retokenized
        return Chunk(ts, min(n, max_tokens), counts_only=True, counted_by=by,
                     over_max=n if n > max_tokens else None)

    def flush_cache(self) -> bool:
        """POST the flush route (falling back to SGLang's); an error or no answer is a warning, once."""
        tried = [self.flush_path]
        try:
            status, _ = self._call("POST", self.flush_path)
            sglang_flush = self.prefix + _PATHS["sglang"][1]
            if status == 404 and self.flush_path != sglang_flush:
                # vLLM serves /reset_prefix_cache only in dev mode; an SGLang server behind the openai
                # backend has /flush_cache instead
                tried.append(sglang_flush)
                status, _ = self._call("POST", sglang_flush)
                if status < 400:
                    self.flush_path = sglang_flush
            problem = f"POST {' and '.join(self.origin + p for p in tried)} answered HTTP {status}" if status >= 400 else None
        except EndpointError as e:
            problem = str(e)
        if problem and not self._warned_flush:
            self._warned_flush = True
            output.stderr.print(f"warning: the prefix cache was not flushed: {problem}")
        if self.flush_sleep_s > 0:
            time.sleep(self.flush_sleep_s)
        return problem is None

    def cancel_all(self) -> None:
        with self._lock:
            socks = list(self._active)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._watchdog.close()

    def __enter__(self) -> HttpTarget:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def knobs(self) -> dict:
        return {"endpoint": self.url, "backend": self.backend, "protocol": self.protocol,
                "flush_sleep_s": self.flush_sleep_s, "request_timeout_s": self.read_timeout_s}


def _is_name(value) -> bool:
    """A non-empty string that UTF-8 can hold: a JSON escape of half a surrogate pair ("\\ud800")
    is no text, and no table, summary or terminal could show it."""
    return isinstance(value, str) and bool(value) and lone_surrogate(value) is None


def _listing_refused_fix(status: int) -> str:
    """What to do when the model listing answered an error status (5xx never gets here: check())."""
    if status == 404:
        return "the server lists no models there: pass --model with the served model name, or check --endpoint / --backend"
    if status in (401, 403):
        return "pass the server's API key in OPENAI_API_KEY"
    if status == 429:
        return "the server is rate limiting this client; retry when it admits requests"
    return "check --endpoint / --backend"


def _redirect_note(resp) -> str:
    """Where a redirect points (salactl follows none), or "" without a Location header."""
    moved = resp.getheader("Location")
    return f", redirected to {moved}: point --endpoint there" if moved else ""


def _json_kind(value) -> str:
    """A JSON value in an error: a scalar as JSON, an array or object by its kind only (it may be long)."""
    if isinstance(value, (list, dict)):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    return json.dumps(value)[:60]


def _local_limit(e: BaseException) -> str | None:
    """What a client-side OS resource error says about this machine; None for any other error."""
    code = getattr(e, "errno", None)
    if code == errno.EMFILE:
        return f"this machine ran out of file descriptors ({_fd_limit()}); raise it"
    if code == errno.ENFILE:
        return "this machine's system-wide open-file table is full (ENFILE); close files or raise fs.file-max"
    if code in (errno.ENOBUFS, errno.ENOMEM):
        return (f"this machine ran out of memory for sockets ({errno.errorcode[code]}); free memory or "
                "lower the concurrency")
    return None


def _fd_limit() -> str:
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (AttributeError, OSError, ValueError):       # no resource module (Windows)
        return "its open-file limit"
    return f"ulimit -n {'unlimited' if soft == resource.RLIM_INFINITY else soft}"


def _why(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, socket.gaierror):
        return f"unknown host: {e.strerror}"
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    return f"{type(e).__name__}: {e}".rstrip(": ")
