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
