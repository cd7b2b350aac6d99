"""Fixtures of the spec tests."""
from __future__ import annotations

import pytest


@pytest.fixture
def started_with(monkeypatch, tmp_path):
    """The spec `epdbench compare ARGS` would start its flow with (the flow itself replaced: nothing runs)."""
    import epdbench.flows.compare as flow
    from epdbench.cli import main

    seen = {}

    class Started(Exception):
        pass

    def compare(spec, **kwargs):
        seen["spec"] = spec
        raise Started
    monkeypatch.setattr(flow, "compare", compare)
    monkeypatch.chdir(tmp_path)

    def run(*argv):
        with pytest.raises(Started):
            main(["compare", *argv])
        return seen["spec"]
    return run
