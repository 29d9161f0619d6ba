"""A real HTTP server on loopback that streams like SGLang `/generate` and OpenAI `/v1/completions`
with known timings: the first token `ttft` s after the request, then one token every `per_token`
s, sent in chunks of 1 and 2 tokens alternately (deadline-based, so sleeps do not accumulate)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK_PATTERN = (1, 2)


def chunk_sizes(n: int) -> list[int]:
    """1 (the first token), then 1, 2, 1, 2, ... summing to n."""
    sizes, left, k = [1], n - 1, 0
    while left > 0:
        g = min(CHUNK_PATTERN[k % len(CHUNK_PATTERN)], left)
        sizes.append(g)
        left -= g
        k += 1
    return sizes


class FakeServer:
    def __init__(self, ttft: float = 0.2, per_token: float = 0.02, model: str = "fake-model"):
        self.ttft, self.per_token, self.model = ttft, per_token, model
        self.edit_event = None          # optional fn(event dict) -> what is streamed instead
        self.cut_after: int | None = None   # close the connection after this many events (no [DONE])
        self.requests: list[dict] = []
        self.flushes = 0
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, status: int, obj) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/health":
                    self._json(200, {})
                elif self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": owner.model, "object": "model"}]})
                elif self.path == "/get_model_info":
                    self._json(200, {"model_path": owner.model})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self):
                t0 = time.perf_counter()
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path in ("/flush_cache", "/reset_prefix_cache"):
                    with owner.lock:
                        owner.flushes += 1
                    self._json(200, {})
                    return
                if self.path not in ("/generate", "/v1/completions"):
                    self._json(404, {"error": "not found"})
                    return
                with owner.lock:
                    owner.requests.append({"path": self.path, "body": body})
                sglang = self.path == "/generate"
                n = body["sampling_params"]["max_new_tokens"] if sglang else body["max_tokens"]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
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
                            time.sleep(left)
                        if sglang:
                            event = {"text": "x" * done, "meta_info": {"completion_tokens": done,
                                                                         "prompt_tokens": 1}, "index": 0}
                        else:
                            event = {"id": "c", "object": "text_completion", "model": owner.model,
                                     "choices": [{"index": 0, "text": "x" * g, "finish_reason": None}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": done,
                                               "total_tokens": 1 + done}}
                        if owner.edit_event is not None:
                            event = owner.edit_event(event)
                        self._chunk(f"data: {json.dumps(event)}\n\n".encode())
                    self._chunk(b"data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            request_queue_size = 128            # the default backlog (5) refuses bursts of connects

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
