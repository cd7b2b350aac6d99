"""Pick the provisioning module of a target (sim, local, kubernetes). Each exposes start(spec, config, spec_path,
log_dir) -> Deployment and stop(Deployment), and raises tasks.deployment.ProvisionError with a reason."""
from __future__ import annotations

from types import ModuleType


def target_module(kind: str) -> ModuleType:
    if kind == "sim":
        from epdbench.tasks.sim import target as sim_target
        return sim_target
    if kind == "local":
        from epdbench.tasks.local import target as local_target
        return local_target
    if kind == "kubernetes":
        from epdbench.tasks.k8s import target as k8s_target
        return k8s_target
    raise ValueError(f"unknown target {kind!r}: use sim, local or kubernetes")
