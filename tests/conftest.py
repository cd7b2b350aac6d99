import os
from pathlib import Path

import pytest

os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")

DATA = Path(__file__).parent / "data"


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
