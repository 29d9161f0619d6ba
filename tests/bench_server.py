"""A real HTTP server on loopback that streams like SGLang `/generate` and OpenAI `/v1/completions`
with known timings: the first token `ttft` s after the request, then one token every `per_token`
s, sent in chunks of 1 and 2 tokens alternately (deadline-based, so sleeps do not accumulate).

Misbehaviours a test can switch on: `usage` ("per-chunk", "final" = one usage-only chunk before
[DONE], "none") for /v1/completions; `stop_after` (fn(requested) -> tokens really sent);
`reject` (fn(n-th generation request, body) -> (status, JSON[, headers]) or None); `respond`
(fn(body) -> a JSON object sent as a plain 200 instead of a stream); `edit_event` (fn(event) -> the
event streamed instead, or a list of events); `ping_every` (a `: ping` comment every so many s while
a token is due); `content_encoding` (a Content-Encoding header on the stream); `flush_routes` (the
flush paths that exist); `api_key` (every path answers 401 without `Authorization: Bearer <key>`);
`prefix` (the request path every route lies under, as it comes on the wire: "/%C3%A4" serves
"/%C3%A4/generate"; any other path answers 404).
`post_log` records when each POST arrived (perf_counter: the client shares this process's clock).
`in_one_of_three_runs` retries a test's timing assertions past a stall of the machine."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK_PATTERN = (1, 2)
TIMING_RUNS = 3


def in_one_of_three_runs(run):
    """run() (requests to a loopback server and assertions on their timings) again, up to TIMING_RUNS
    times in all, while an assertion fails: a loaded CI machine stalls for up to a second now and then,
    which upsets one run's timings, where a measuring bug fails every run."""
    for attempt in range(TIMING_RUNS):
        try:
            return run()
        except AssertionError:
            if attempt == TIMING_RUNS - 1:
                raise


def chunk_sizes(n: int) -> list[int]:
    """1 (the first token), then 1, 2, 1, 2, ... summing to n."""
    sizes, left, k = [1], n - 1, 0
    while left > 0:
        g = min(CHUNK_PATTERN[k % len(CHUNK_PATTERN)], left)
        sizes.append(g)
        left -= g
        k += 1
    return sizes


def _usage(done: int) -> dict:
    return {"prompt_tokens": 1, "completion_tokens": done, "total_tokens": 1 + done}


class FakeServer:
    def __init__(self, ttft: float = 0.2, per_token: float = 0.02, model: str = "fake-model"):
        self.ttft, self.per_token, self.model = ttft, per_token, model
        self.edit_event = None          # optional fn(event dict) -> what is streamed instead (or a list)
        self.ping_every: float | None = None
        self.content_encoding: str | None = None
        self.seen_headers: list[dict] = []  # the headers of each generation request
        self.cut_after: int | None = None   # close the connection after this many events (no [DONE])
        self.usage = "per-chunk"
        self.token_text = "x"               # the text of one token
        self.stop_after = None
        self.reject = None
        self.respond = None
        self.flush_routes = {"/flush_cache", "/reset_prefix_cache"}
        self.api_key: str | None = None
        self.prefix = ""
        self.requests: list[dict] = []
        self.flushes = 0
        self.side_posts: list[str] = []     # POST paths other than generation, in order
        self.post_log: list[tuple[float, str]] = []     # (perf_counter at arrival, path) of every POST
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, status: int, obj, headers: dict | None = None) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                if owner.api_key is None or self.headers.get("Authorization") == f"Bearer {owner.api_key}":
                    return True
                self._json(401, {"error": {"message": "invalid API key", "type": "auth"}})
                return False

            def _route(self) -> str:
                """The path below owner.prefix ("" when outside it: no route has that path)."""
                return self.path[len(owner.prefix):] if self.path.startswith(owner.prefix) else ""

            def do_GET(self):
                if not self._authorized():
                    return
                path = self._route()
                if path == "/health":
                    self._json(200, {})
                elif path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": owner.model, "object": "model"}]})
                elif path == "/get_model_info":
                    self._json(200, {"model_path": owner.model})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self):
                t0 = time.perf_counter()
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorized():
                    return
                path = self._route()
                with owner.lock:
                    owner.post_log.append((t0, path or self.path))
                if path in owner.flush_routes:
                    with owner.lock:
                        owner.flushes += 1
                        owner.side_posts.append(path)
                    self._json(200, {})
                    return
                if path not in ("/generate", "/v1/completions"):
                    with owner.lock:
                        owner.side_posts.append(path or self.path)
                    self._json(404, {"error": "not found"})
                    return
                with owner.lock:
                    owner.requests.append({"path": path, "body": body})
                    owner.seen_headers.append(dict(self.headers))
                    nth = len(owner.requests)
                if owner.reject is not None and (answer := owner.reject(nth, body)) is not None:
                    self._json(*answer)
                    return
                if owner.respond is not None:
                    self._json(200, owner.respond(body))
                    return
                sglang = path == "/generate"
                n = body["sampling_params"]["max_new_tokens"] if sglang else body["max_tokens"]
                if owner.stop_after is not None:
                    n = owner.stop_after(n)
                usage = "per-chunk" if sglang else owner.usage
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                if owner.content_encoding:
                    self.send_header("Content-Encoding", owner.content_encoding)
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                done = 0
                try:
                    for i, g in enumerate(chunk_sizes(n)):
                        if i == owner.cut_after:
                            self.close_connection = True
                            return
                        done += g
                        deadline = t0 + owner.ttft + (done - 1) * owner.per_token
                        while (left := deadline - time.perf_counter()) > 0:
                            time.sleep(min(left, owner.ping_every or left))
                            if owner.ping_every:
                                self._chunk(b": ping\n\n")
                        if sglang:
                            event = {"text": owner.token_text * done, "index": 0,
                                     "meta_info": {"completion_tokens": done, "prompt_tokens": 1}}
                        else:
                            event = {"id": "c", "object": "text_completion", "model": owner.model,
                                     "choices": [{"index": 0, "text": owner.token_text * g,
                                                  "finish_reason": None}]}
                            if usage == "per-chunk":
                                event["usage"] = _usage(done)
                        if owner.edit_event is not None:
                            event = owner.edit_event(event)
                        for one in event if isinstance(event, list) else [event]:
                            self._chunk(f"data: {json.dumps(one)}\n\n".encode())
                    if usage == "final":
                        final = {"id": "c", "object": "text_completion", "model": owner.model,
                                 "choices": [], "usage": _usage(done)}
                        self._chunk(f"data: {json.dumps(final)}\n\n".encode())
                    self._chunk(b"data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            # the default backlog (5) refuses bursts of connects; 128 overflowed on a busy 2-core machine
            # while the accept loop waited for the GIL (connects timed out or were reset in open-loop tests)
            request_queue_size = 2048

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def request_time(self, n: int) -> float:
        """Client-visible E2E of one request with n output tokens."""
        return self.ttft + (n - 1) * self.per_token
