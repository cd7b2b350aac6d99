"""Pick the provisioning module of a target (sim, local, kubernetes). Each exposes start(spec, config, spec_path,
log_dir) -> Deployment and stop(Deployment), and raises tasks.deployment.ProvisionError with a reason."""
from __future__ import annotations

from types import ModuleType


def target_module(kind: str) -> ModuleType:
    if kind == "sim":
        from epdbench.tasks import sim_target
        return sim_target
    if kind == "local":
        from epdbench.tasks import local_target
        return local_target
    if kind == "kubernetes":
        from epdbench.tasks import k8s_target
        return k8s_target
    raise ValueError(f"unknown target {kind!r}: use sim, local or kubernetes")
