"""The local target's one-line refusals before and at an engine's start: an interpreter that cannot import vllm, a
port taken before the engine binds it (an engine that dies at start is tests/tasks/proc/test_ports.py's)."""
from __future__ import annotations

import socket
import sys

import pytest

from epdbench.specs.models import load_spec, parse_spec
from epdbench.tasks.deployment import ProvisionError
from epdbench.tasks.local import target


def local_spec(python: str):
    data = load_spec("cpu-tiny").model_dump(mode="json")
    data["target"]["local"]["vllm_python"] = python
    data["target"]["local"]["tiny_model"] = False
    return parse_spec(data, "cpu-tiny")


def test_an_interpreter_without_vllm_is_refused_in_one_line_naming_the_field(tmp_path):
    spec = local_spec(sys.executable)       # epdbench's own interpreter: no vllm in it
    with pytest.raises(ProvisionError) as e:
        target.start(spec, spec.configuration("aggregated"), tmp_path / "spec.yaml", tmp_path / "logs")
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"target.local.vllm_python {sys.executable} cannot import vllm")


def test_a_port_taken_before_the_engine_starts_is_refused_in_one_line_and_nothing_is_left(tmp_path, monkeypatch):
    spec = local_spec(sys.executable)
    monkeypatch.setattr(target, "vllm_version", lambda python, make: "0.32.0")
    spawned = []
    monkeypatch.setattr(target, "spawn", lambda *a, **k: spawned.append(a))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setattr(target, "free_port", lambda host: port)
        with pytest.raises(ProvisionError) as e:
            target.start(spec, spec.configuration("aggregated"), tmp_path / "spec.yaml", tmp_path / "logs")
    assert str(e.value) == (f"server-0: port {port} on 127.0.0.1 was taken by another process before the engine "
                            "started; run again")
    assert spawned == []
