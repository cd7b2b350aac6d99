"""Deployment topologies: the roles of a configuration (aggregated, PD, EPD), their replicas, TP and KV transport."""
from __future__ import annotations

from pydantic import Field, model_validator

from epdbench.specs.base import KvConnector, KvTransport, RoleName, Strict, Topology

MAX_REPLICAS = 16       # of one role of a configuration


class RoleSpec(Strict):
    role: RoleName = Field(title="Role", description="server (aggregated), prefill, decode or encode.")
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, title="Replicas", description="Pods (or simulator processes) of this role.")
    tp: int = Field(1, ge=1, le=8, title="Tensor parallel size", description="GPUs per replica.")
    rdma_interfaces: int = Field(0, ge=0, le=8, title="RDMA interfaces",
                                 description="RDMA NICs per replica (KV over RDMA only).")


_ROLES_BY_TOPOLOGY: dict[str, set[str]] = {
    "aggregated": {"server"},
    "pd": {"prefill", "decode"},
    "epd": {"encode", "prefill", "decode"},
}


class ConfigurationSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", title="Name",
                      description="Short name used in results, e.g. pd-tcp.")
    topology: Topology = Field(title="Topology", description="aggregated, pd or epd.")
    kv_transport: KvTransport = Field("none", title="KV transport",
                                      description="How KV moves from Prefill to Decode: none, tcp or rdma.")
    kv_connector: KvConnector = Field(
        "mooncake", title="KV connector",
        description="vLLM's KV connector: mooncake (MooncakeConnector, Mooncake transfer engine) or nixl "
                    "(NixlConnector: NIXL over UCX, as llm-d deploys PD).")
    ec_transport: KvTransport | None = Field(
        None, title="Encoder-output transport",
        description="EPD only: the transport expected to carry encoder outputs from Encode to Prefill "
                    "(the encoder-cache connector over NIXL/UCX); empty: tcp.")
    roles: list[RoleSpec] = Field(min_length=1, title="Roles", description="Role replicas and their TP.")

    @model_validator(mode="after")
    def _check_roles(self) -> "ConfigurationSpec":
        have = {r.role for r in self.roles}
        want = _ROLES_BY_TOPOLOGY[self.topology]
        if have != want:
            raise ValueError(f"topology {self.topology} needs roles {sorted(want)}, got {sorted(have)}")
        if len(self.roles) != len(have):
            raise ValueError("each role may appear once; use replicas for more pods")
        if self.topology == "aggregated" and self.kv_transport != "none":
            raise ValueError("aggregated serving moves no KV: set kv_transport: none")
        if self.topology != "aggregated" and self.kv_transport == "none":
            raise ValueError(f"{self.topology} needs kv_transport tcp or rdma")
        if self.topology == "aggregated" and self.kv_connector != "mooncake":
            raise ValueError("aggregated serving has no KV connector: leave kv_connector unset")
        if self.ec_transport is not None and self.topology != "epd":
            raise ValueError("ec_transport applies to epd configurations only (encoder outputs move Encode -> Prefill)")
        if self.ec_transport == "none":
            raise ValueError("an epd configuration moves encoder outputs: ec_transport tcp or rdma")
        if self.kv_transport == "rdma":
            for r in self.roles:
                if r.role in ("prefill", "decode") and r.rdma_interfaces < 1:
                    raise ValueError(f"kv_transport rdma needs rdma_interfaces >= 1 on role {r.role}")
        if self.ec_transport == "rdma":
            for r in self.roles:
                if r.role in ("encode", "prefill") and r.rdma_interfaces < 1:
                    raise ValueError(f"ec_transport rdma needs rdma_interfaces >= 1 on role {r.role}")
        return self

    @property
    def ec_expected(self) -> str:
        """The transport expected to carry encoder outputs (EPD), or none."""
        if self.topology != "epd":
            return "none"
        return self.ec_transport or "tcp"

    @property
    def gpus(self) -> int:
        return sum(r.replicas * r.tp for r in self.roles)

    def role(self, name: str) -> RoleSpec | None:
        return next((r for r in self.roles if r.role == name), None)
