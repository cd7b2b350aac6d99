import os
import signal
import sys
from pathlib import Path

import pytest

# Tests that press Ctrl-C (SIGINT to a command or its process group) need the commands they start to react as a
# terminal's foreground job does. A test run started in the background by a shell without job control (`pytest &`
# in a script) ignores SIGINT, and every child would inherit that: Python then installs no KeyboardInterrupt
# handler and the command runs on. Give SIGINT back its default here, so children start with it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")

DATA = Path(__file__).parent / "data"


def pytest_sessionfinish(session):
    """End Prefect's background work of this session while pytest's streams are still open, as Prefect's own test
    harness does: send the events and logs still queued, then stop the temporary API server a flow run started in
    this process. Left to their exit hooks, the server stops first (the events client then fails to reconnect) and
    both log through Prefect's console handler, which holds the stream pytest captured when Prefect set up its
    logging, closed by then: a "--- Logging error --- … I/O operation on closed file" after a green run. The
    server's own line ("Stopping temporary server") tells a test run nothing: kept below WARNING."""
    import logging

    server = sys.modules.get("prefect.server.api.server")
    if server is None:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=10)
    logger = server.subprocess_server_logger
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        for instance in list(server.SubprocessASGIServer._instances.values()):
            instance.stop()
    finally:
        logger.setLevel(level)


@pytest.fixture(scope="session")
def tiny_spec_path() -> Path:
    return DATA / "tiny.yaml"


@pytest.fixture(scope="session")
def tiny_spec(tiny_spec_path):
    from epdbench.specs.models import load_spec
    return load_spec(str(tiny_spec_path))


class CompareStarted(Exception):
    """Raised where `epdbench compare` would start its flow (fixture compare_started)."""


@pytest.fixture
def compare_started(monkeypatch):
    """`main(["compare", ...])` raises CompareStarted where the flow would start, after every check of its
    options; the signal handlers the command installs are put back afterwards."""
    import signal

    import epdbench.flows.compare as flow

    def started(*args, **kwargs):
        raise CompareStarted

    monkeypatch.setattr(flow, "compare", started)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield CompareStarted
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
