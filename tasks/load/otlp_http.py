"""OTLP/HTTP export requests as http.server handlers read and answer them (POST /v1/traces, protobuf, gzip or
not): shared by the run's receiver (tasks.load.otlp_receiver) and the in-cluster collector
(tasks.k8s.incluster_traces), which imports nothing heavier than this."""
from __future__ import annotations

import gzip
from http.server import BaseHTTPRequestHandler

from epdbench.otlp import decode_spans

MAX_BODY = 64 << 20


def reply(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"",
          content_type: str = "application/x-protobuf") -> None:
    """An empty body with 200 is an empty ExportTraceServiceResponse: every span accepted. An exporter gone before
    its answer (an engine killed, or stopped, while it exported) is no error of the receiver's: nothing is said."""
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    except (BrokenPipeError, ConnectionResetError):
        handler.close_connection = True


def read_export(handler: BaseHTTPRequestHandler) -> list[dict] | int:
    """The spans of one OTLP/HTTP export POSTed to `handler` (protobuf, gzip or not), or the error status to
    answer: 404 wrong path, 413 too large, 400 not an export."""
    n = int(handler.headers.get("Content-Length") or 0)
    if handler.path.rstrip("/") != "/v1/traces" or n > MAX_BODY:
        return 404 if n <= MAX_BODY else 413
    body = handler.rfile.read(n)
    try:
        if handler.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        return decode_spans(body)
    except (ValueError, OSError, EOFError):
        return 400
