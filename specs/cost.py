"""What serving costs: the price of a GPU-hour the report turns into cost per million output tokens. Pure: the
spec's section only; the arithmetic is analysis.pareto's."""
from __future__ import annotations

from pydantic import Field

from epdbench.specs.base import Strict


class CostSpec(Strict):
    gpu_hour_usd: float | None = Field(None, ge=0, allow_inf_nan=False, title="Price per GPU-hour (USD)",
                                       description="What one GPU of the node costs per hour (cloud list price or "
                                                   "your own amortised figure): the report's cost per million "
                                                   "output tokens is this times each configuration's GPUs over its "
                                                   "output throughput. `epdbench compare --gpu-hour-usd` "
                                                   "overrides it. Empty: no cost figures.")
