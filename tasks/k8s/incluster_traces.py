"""`epdbench collect-traces`: the run's trace collector as it runs inside the cluster (a container beside the
router, whose Service names its port `otlp`). The engines cannot reach the runner, so they export their spans
here (OTLP/HTTP protobuf, POST /v1/traces, as to the runner's own receiver on the other targets); the runner
takes them back through its way in to the cluster (tasks.k8s.traces) with GET /v1/spans?after=CURSOR.

What it keeps: the spans that have a parent. A traced request's engine spans are children of the load
generator's span (through its `traceparent`); vLLM also makes a root span for every request nobody traced
(warm-up, calibration, readiness probes), which no record names and which would only fill the buffer.
What it holds is bounded (max_spans): past that, spans are dropped and counted, never taken from the ones
waiting. A GET answers one page of spans after the cursor and forgets the ones at or before it (the runner has
them); `epoch` changes when the collector restarts, so the runner knows its cursor means nothing here."""
from __future__ import annotations

import json
import secrets
import signal
import threading
import urllib.parse
from collections import deque
from itertools import islice
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from epdbench.specs.commands import OTLP_PORT
from epdbench.tasks.load.otlp_http import read_export, reply

MAX_SPANS = 100_000         # 1-2 KB each in memory: within the container's 512Mi; a traced request has 2-6
PAGE_SPANS = 5_000          # per GET: one answer stays a few MB through the API server's proxy


class SpanBuffer:
    """The spans waiting for the runner, numbered in arrival order (thread-safe)."""

    def __init__(self, max_spans: int = MAX_SPANS):
        self.max_spans = max_spans
        self.epoch = secrets.token_hex(8)
        self._lock = threading.Lock()
        self._spans: deque[tuple[int, dict]] = deque()
        self._seq = 0
        self.received = self.unparented = self.dropped = 0

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._spans)

    def add(self, spans: list[dict]) -> None:
        with self._lock:
            self.received += len(spans)
            for span in spans:
                if not span.get("parent_span_id"):
                    self.unparented += 1
                elif len(self._spans) >= self.max_spans:
                    self.dropped += 1
                else:
                    self._seq += 1
                    self._spans.append((self._seq, span))

    def page(self, after: int, epoch: str | None = None, limit: int = PAGE_SPANS) -> dict:
        """The spans numbered after `after` (at most `limit`), once those up to it are forgotten. A cursor from
        another epoch (a restarted collector) starts from the beginning."""
        with self._lock:
            if epoch != self.epoch:
                after = 0
            while self._spans and self._spans[0][0] <= after:
                self._spans.popleft()
            taken = list(islice(self._spans, limit))
            nxt = taken[-1][0] if taken else max(after, 0)
            return {"epoch": self.epoch, "next": nxt, "more": len(self._spans) > len(taken),
                    "spans": [s for _, s in taken],
                    "received": self.received, "unparented": self.unparented, "dropped": self.dropped,
                    "waiting": len(self._spans)}


def make_server(buffer: SpanBuffer, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            spans = read_export(self)
            if isinstance(spans, int):
                return reply(self, spans)
            buffer.add(spans)
            reply(self, 200)

        def do_GET(self):  # noqa: N802
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/health":
                return reply(self, 200, b"ok\n", "text/plain")
            if url.path != "/v1/spans":
                return reply(self, 404, b"not found\n", "text/plain")
            query = urllib.parse.parse_qs(url.query)
            try:
                after = int(query.get("after", ["0"])[0])
            except ValueError:
                return reply(self, 400, b"after: an integer cursor\n", "text/plain")
            body = json.dumps(buffer.page(after, query.get("epoch", [None])[0])).encode()
            reply(self, 200, body, "application/json")

        def log_message(self, *args):   # no line per export
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve(host: str = "0.0.0.0", port: int = OTLP_PORT, max_spans: int = MAX_SPANS) -> int:
    """Serve until SIGTERM or SIGINT; one line at start and one at the end, with the counts."""
    buffer = SpanBuffer(max_spans)
    server = make_server(buffer, host, port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, name="epdbench-collect-traces", daemon=True).start()
    print(f"epdbench trace collector: OTLP/HTTP on {host}:{server.server_address[1]} (POST /v1/traces), "
          f"spans for the runner at GET /v1/spans, holding at most {max_spans}", flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    print(f"epdbench trace collector: stopped; received {buffer.received} spans, kept "
          f"{buffer.received - buffer.unparented - buffer.dropped}, {buffer.unparented} without a parent (untraced "
          f"requests), {buffer.dropped} dropped (buffer full), {buffer.waiting} never taken", flush=True)
    return 0
