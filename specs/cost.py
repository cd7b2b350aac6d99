"""What serving costs: the price of a GPU-hour the report turns into cost per million output tokens, and the GPU
budget every configuration is deployed at. Pure: the spec's section only; the arithmetic is analysis.pareto's, the
scaling specs.budget's."""
from __future__ import annotations

from pydantic import Field, model_validator

from epdbench.specs.base import Strict
from epdbench.specs.topology import MAX_REPLICAS


class BudgetScale(Strict):
    configuration: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Configuration",
                               description="The name of a configuration the budget scaled.")
    gpus: int = Field(ge=1, title="GPUs as written",
                      description="Its GPUs as the spec gives them (roles × replicas × TP), before scaling.")
    scale: int = Field(ge=1, le=MAX_REPLICAS, title="Scale",
                       description="k = floor(gpu_budget / gpus): every role's replicas were multiplied by it, so "
                                   "the configuration ran on k × gpus GPUs.")


class CostSpec(Strict):
    gpu_hour_usd: float | None = Field(None, ge=0, allow_inf_nan=False, title="Price per GPU-hour (USD)",
                                       description="What one GPU of the node costs per hour (cloud list price or "
                                                   "your own amortised figure): the report's cost per million "
                                                   "output tokens is this times each configuration's GPUs over its "
                                                   "output throughput. `epdbench compare --gpu-hour-usd` "
                                                   "overrides it. Empty: no cost figures.")
    gpu_budget: int | None = Field(None, ge=1, title="GPU budget",
                                   description="GPUs every configuration may use: each is deployed with every "
                                               "role's replicas multiplied by k = floor(gpu_budget / its GPUs), so "
                                               "configurations of different sizes are measured, not projected, on "
                                               "(about) the same number of GPUs. It sits in cost because a GPU "
                                               "count is what a deployment costs: at one price per GPU-hour an "
                                               "equal budget is an equal bill. At most hardware.gpus_per_node; "
                                               "refused when the local target's engines share one GPU "
                                               "(target.local.gpu_share: every configuration counts one). "
                                               "`epdbench compare --gpu-budget` overrides it. Empty: every "
                                               "configuration as written.")
    budget_scales: list[BudgetScale] = Field(
        default_factory=list, title="Budget scaling (resolved)",
        description="Written by epdbench into the run's resolved spec.yaml when it applies gpu_budget: each "
                    "configuration's GPUs as written and the factor its replicas were multiplied by (the "
                    "configurations there are the scaled ones). Leave it out of your own specs.")

    @model_validator(mode="after")
    def _check_scales(self) -> "CostSpec":
        if not self.budget_scales:
            return self
        if self.gpu_budget is None:
            raise ValueError("budget_scales records a scaling to a GPU budget but gpu_budget is empty: set "
                             "gpu_budget again, or drop budget_scales and give the configurations as written")
        names = [s.configuration for s in self.budget_scales]
        if len(set(names)) != len(names):
            raise ValueError(f"budget_scales names a configuration twice: {names}")
        for s in self.budget_scales:
            if s.scale != self.gpu_budget // s.gpus:
                raise ValueError(f"budget_scales: {s.configuration} ×{s.scale} of {s.gpus} GPU{'s' * (s.gpus != 1)} is not what "
                                 f"gpu_budget {self.gpu_budget} gives (×{self.gpu_budget // s.gpus}): drop "
                                 "budget_scales and give the configurations as written; epdbench writes it")
        return self

    def budget_scale(self, configuration: str) -> int:
        """The factor the GPU budget multiplied a configuration's replicas by (1: not scaled)."""
        return next((s.scale for s in self.budget_scales if s.configuration == configuration), 1)
