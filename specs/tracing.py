"""Per-request timelines: which requests the load generator traces (a W3C `traceparent` per sampled request,
engines joining its trace). Pure: the spec's section and the sampling rule."""
from __future__ import annotations

from pydantic import Field

from epdbench.specs.base import Strict


class TracingSpec(Strict):
    enabled: bool = Field(True, title="Trace requests",
                          description="Send a W3C traceparent with sampled measured requests and collect the engines' "
                                      "spans (OpenTelemetry) into traces/<config>.parquet and MLflow traces. "
                                      "false: no header, no receiver, no spans.")
    per_cell: int = Field(32, ge=1, le=10_000, title="Traced requests per cell",
                          description="A cell with at most this many measured requests has every one traced; a "
                                      "larger one this many, spread evenly over the cell (first to last).")


def traced_indices(n_measured: int, per_cell: int) -> set[int]:
    """Which measured requests (0-based, in send order) a cell traces: all when there are at most `per_cell`,
    else `per_cell` of them spaced evenly from the first to the last (deterministic, so every configuration and
    trial traces the same positions)."""
    if n_measured <= per_cell:
        return set(range(n_measured))
    if per_cell == 1:
        return {0}
    step = (n_measured - 1) / (per_cell - 1)
    return {round(k * step) for k in range(per_cell)}
