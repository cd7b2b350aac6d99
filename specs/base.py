"""The base of every spec model: strict (unknown fields rejected, frozen) and the shared choices."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

RoleName = Literal["server", "prefill", "decode", "encode"]
Topology = Literal["aggregated", "pd", "epd"]
KvTransport = Literal["none", "tcp", "rdma"]
# The vLLM KV connector of a disaggregated configuration: MooncakeConnector or NixlConnector (NIXL over UCX).
KvConnector = Literal["mooncake", "nixl"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
