"""The run's trace collector: an OTLP/HTTP receiver (protobuf, POST /v1/traces) on a loopback port, to which the
configuration's engines export their spans (the simulator's processes, or real vLLM started with
`--otlp-traces-endpoint http://127.0.0.1:PORT/v1/traces` and OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf),
joined with the load generator's traced records by trace id and appended to traces/<config>.parquet
(tasks.rundir.traces) as each cell ends.

A span is written once: only when its trace belongs to a recorded request (spans of untraced requests, which
vLLM makes too, are dropped), and never twice (the file and this process both remember what was written). A
span that arrives after its cell was written goes out with the next cell's, or at close().

In virtual time (flows.virtual) no receiver listens: the virtual core hands its spans to receive() itself, each
cell's before its records, and flush(0) writes them without waiting."""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

from epdbench.tasks.load.otlp_http import read_export, reply
from epdbench.tasks.rundir.traces import append_spans, client_span, span_row

QUIET_S = 0.3          # a cell's spans are taken as all there once none came for this long (exporters batch)
PULL_S = 0.2           # between two pulls from an in-cluster collector


class TraceCollector:
    """`pull`: where the engines cannot reach this process (Kubernetes), a callable returning the spans an
    in-cluster collector received since the last call (tasks.k8s.traces); flush() polls it instead of listening."""

    def __init__(self, path: Path, host: str = "127.0.0.1", quiet_s: float = QUIET_S,
                 pull: Callable[[], list[dict]] | None = None):
        self.path, self.host, self.quiet_s, self.pull = Path(path), host, quiet_s, pull
        self._lock = threading.Lock()
        self._spans: dict[str, list[dict]] = {}     # trace id -> engine/router spans received, not yet written
        self._records: dict[str, dict] = {}         # trace id -> its record row (request id, cell columns)
        self._written: set[tuple[str, str]] = set()
        self._joined: set[str] = set()              # trace ids some engine/router span came for
        self._waiting: set[str] = set()             # recorded trace ids the last flush did not see joined
        self._last = time.monotonic()
        self.received = self.rejected = 0
        self._server: ThreadingHTTPServer | None = None

    # --- the receiver -------------------------------------------------------------------------------
    def start(self) -> str:
        """Listen on a free loopback port; returns the traces endpoint URL."""
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                spans = read_export(self)
                if isinstance(spans, int):
                    collector.rejected += 1
                    return reply(self, spans)
                collector.receive(spans)
                reply(self, 200)

            def log_message(self, *args):   # no access lines on the run's console
                pass

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="epdbench-otlp", daemon=True).start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://{self.host}:{self._server.server_address[1]}/v1/traces"

    def receive_some(self, spans: list[dict]) -> None:
        """receive(), only when there are spans (an empty pull is no news: the quiet time runs on)."""
        if spans:
            self.receive(spans)

    def receive(self, spans: list[dict]) -> None:
        with self._lock:
            for s in spans:
                self._spans.setdefault(s["trace_id"], []).append(s)
                self._joined.add(s["trace_id"])
            self.received += len(spans)
            self._last = time.monotonic()

    # --- the join -----------------------------------------------------------------------------------
    def add_records(self, rows: list[dict]) -> int:
        """The traced ones of a cell's record rows (with their cell columns); returns how many were traced."""
        traced = [r for r in rows if r.get("trace")]
        with self._lock:
            for r in traced:
                self._records[r["trace"][0]] = r
                self._waiting.add(r["trace"][0])
                self._spans.setdefault(r["trace"][0], []).append(client_span(r))
        return len(traced)

    def discard(self, rows: list[dict]) -> None:
        """Forget the spans of these record rows' traces (a cell served again but not recorded: a virtual run's
        resume)."""
        with self._lock:
            for r in rows:
                if r.get("trace"):
                    self._spans.pop(r["trace"][0], None)

    def flush(self, max_wait_s: float = 3.0) -> int:
        """Wait (bounded) until every recorded trace has an engine span and none came for quiet_s, then append
        the spans of recorded traces not yet written; returns how many were written."""
        deadline = time.monotonic() + max_wait_s
        while time.monotonic() < deadline:
            if self.pull is not None:
                self.receive_some(self.pull())
            with self._lock:
                quiet = time.monotonic() - self._last >= self.quiet_s
                missing = bool(self._waiting - self._joined)    # a trace with its client span only, so far
            if quiet and not missing:
                break
            time.sleep(PULL_S if self.pull is not None else 0.05)
        with self._lock:
            self._waiting.clear()          # waited for once: a late span still goes out with a later flush
            rows = []
            for t, spans in list(self._spans.items()):
                record = self._records.get(t)
                if record is None:
                    continue
                for s in spans:
                    if (t, s["span_id"]) not in self._written:
                        self._written.add((t, s["span_id"]))
                        rows.append(span_row(s, record))
                self._spans[t] = []
        append_spans(self.path, rows)
        return len(rows)

    def close(self, max_wait_s: float = 1.0) -> int:
        """The last spans written; the receiver stopped. Spans of traces no record names are dropped."""
        try:
            return self.flush(max_wait_s)
        finally:
            if self._server is not None:
                self._server.shutdown()
                self._server.server_close()
                self._server = None
