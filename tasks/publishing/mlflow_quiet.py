"""MLflow unreachable, quietly. An http(s) tracking URI whose port refuses a TCP connection fails at once with
`MlflowUnreachable` (no retry loop); every call through `Tracker.client` (tasks.publishing.tracking) runs with
MLflow's and urllib3's loggers raised to ERROR (`quiet_mlflow`), and urllib3's "Retrying (...)" warnings about
MLflow REST paths are dropped process-wide (`silence_mlflow_retries`). How many retries and how long each waits are
`MLFLOW_HTTP_REQUEST_MAX_RETRIES` / `MLFLOW_HTTP_REQUEST_TIMEOUT` (the CLI's `quiet_defaults` sets 2 and 20 s).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from contextlib import contextmanager
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 5.0
REASON_LIMIT = 1000       # characters of an error kept in one line (an HTML error page is cut, MLflow's reason is not)
QUIET_LOGGERS = ("mlflow", "urllib3")
# The REST paths of MLflow's client calls (urllib3 names the path in each retry warning)
MLFLOW_REST_PATHS = ("/api/2.0/mlflow", "/api/3.0/mlflow", "/ajax-api/", "/api/2.0/mlflow-artifacts")


class MlflowUnreachable(ConnectionError):
    """The tracking server cannot be reached (nothing listens, DNS, timeout); the message is the cause."""


# --- quiet ---------------------------------------------------------------------------------------------

class _MlflowRetryFilter(logging.Filter):
    """Drops urllib3's per-attempt retry warnings about MLflow REST calls (the final error is raised anyway)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to judge
            return True
        return not (msg.startswith("Retrying") and any(p in msg for p in MLFLOW_REST_PATHS))


_RETRY_FILTER = _MlflowRetryFilter()
_quiet_lock = threading.Lock()
_quiet_depth = 0
_saved_levels: dict[str, int] = {}


def silence_mlflow_retries() -> None:
    """Process-wide, idempotent: no "Retrying (...)" warning line per attempt at an MLflow server."""
    for name in ("urllib3.connectionpool", "urllib3.util.retry"):
        logger = logging.getLogger(name)
        if _RETRY_FILTER not in logger.filters:
            logger.addFilter(_RETRY_FILTER)


@contextmanager
def quiet_mlflow():
    """MLflow's and urllib3's loggers at ERROR while epdbench talks to MLflow (reentrant, thread-safe:
    the levels are restored when the last caller leaves)."""
    global _quiet_depth
    silence_mlflow_retries()
    with _quiet_lock:
        if _quiet_depth == 0:
            for name in QUIET_LOGGERS:
                logger = logging.getLogger(name)
                _saved_levels[name] = logger.level
                logger.setLevel(max(logger.level, logging.ERROR))
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                for name, level in _saved_levels.items():
                    logging.getLogger(name).setLevel(level)
                _saved_levels.clear()


class QuietClient:
    """An MlflowClient whose every method call runs under `quiet_mlflow()`."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        if name.startswith("__") or name == "_client":     # copy/pickle probes before __init__ ran
            raise AttributeError(name)
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            with quiet_mlflow():
                return attr(*args, **kwargs)
        return call


def probe(tracking_uri: str, timeout: float | None = None) -> None:
    """Raise MlflowUnreachable at once when an http(s) tracking server refuses a TCP connection (no retry
    loop, no warnings). Other schemes, and hosts reached through a proxy, are not probed."""
    import urllib.request

    u = urlparse(tracking_uri)
    if u.scheme not in ("http", "https") or not u.hostname:
        return
    if urllib.request.getproxies().get(u.scheme) and not urllib.request.proxy_bypass(u.hostname):
        return
    if timeout is None:
        try:
            timeout = min(PROBE_TIMEOUT_S, float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", PROBE_TIMEOUT_S)))
        except ValueError:
            timeout = PROBE_TIMEOUT_S
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=timeout).close()
    except OSError as e:
        raise MlflowUnreachable(f"{type(e).__name__}: {e}") from None


def is_unreachable(e: BaseException) -> bool:
    """An exception that means the tracking server could not be reached (not a bad request)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (ConnectionError, TimeoutError, socket.timeout)):
            return True
        name = type(e).__name__
        text = str(e)
        if name in ("ConnectionError", "ConnectTimeout", "ReadTimeout", "MaxRetryError", "NewConnectionError"):
            return True
        if any(s in text for s in ("Max retries exceeded", "Connection refused", "Failed to establish a new connection",
                                   "Name or service not known", "timed out")):
            return True
        e = e.__cause__ or e.__context__
    return False


def failure_reason(e: BaseException) -> str:
    """An error on one line: its type and its whole message, whitespace folded, within REASON_LIMIT."""
    text = " ".join(str(e).split())
    cause = text if isinstance(e, MlflowUnreachable) else f"{type(e).__name__}: {text}".rstrip(": ")
    return cause if len(cause) <= REASON_LIMIT else cause[:REASON_LIMIT - 1] + "…"
