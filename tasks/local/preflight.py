"""Before a --target local run starts anything (Prefect, MLflow, a process): what it needs is there. Each lack is
one line naming the command that supplies it: `tokenizers` in epdbench's environment when the spec makes the tiny
model, the vllm-router binary when a configuration is served through it (not with target.local.router builtin, nor
for EPD, which take epdbench's proxy), and an interpreter of vLLM's own environment that imports vllm. The look-ups are
parameters, so the checks are tested without touching the machine."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable

from epdbench.specs.models import ExperimentSpec
from epdbench.tasks.deployment import ProvisionError
from epdbench.tasks.local.engine_env import EngineEnvError, vllm_version
from epdbench.tasks.local.target import builtin_router, make_engine_env, vllm_python
from epdbench.tasks.proc.processes import router_binary


class PreflightError(ValueError):
    """The local target lacks something; the message is one line naming it and the command that supplies it."""


def module_found(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def find_router() -> str | None:
    try:
        return router_binary()
    except ProvisionError:
        return None


def preflight_local(spec: ExperimentSpec, *, has_module: Callable[[str], bool] = module_found,
                    router: Callable[[], str | None] = find_router,
                    engine: Callable[..., str] = vllm_version) -> str:
    """vLLM's version in the engines' interpreter once everything the run needs is there; PreflightError for the
    first thing that is not (cheapest first: the interpreter check starts a Python)."""
    local = spec.target.local
    if local.tiny_model and not has_module("tokenizers"):
        raise PreflightError("target.local.tiny_model: epdbench makes the tiny model with `tokenizers`, which its "
                             "environment lacks: pip install -e '.[local]' (the local extra)")
    users = [c.name for c in spec.configurations if not builtin_router(spec, c)]
    if users and router() is None:
        raise PreflightError(f"vllm-router is not installed in epdbench's environment (the router in front of "
                             f"{', '.join(users)}): pip install -e . (it is one of epdbench's dependencies; the GPU "
                             "bundle leaves it out), or set target.local.router: builtin")
    flag = "--vllm-python" if local.vllm_python else "target.local.vllm_python (unset: the default)"
    try:
        return engine(vllm_python(spec), make=make_engine_env(local.device))
    except EngineEnvError as e:
        raise PreflightError(f"{flag} {e}") from None
