"""The base of every spec model: strict (unknown fields rejected, frozen) and the shared choices."""
from __future__ import annotations

from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

RoleName = Literal["server", "prefill", "decode", "encode"]
Topology = Literal["aggregated", "pd", "epd"]
KvTransport = Literal["none", "tcp", "rdma"]
# The vLLM KV connector of a disaggregated configuration: MooncakeConnector or NixlConnector (NIXL over UCX).
KvConnector = Literal["mooncake", "nixl"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _BlockDumper(yaml.SafeDumper):
    """yaml.SafeDumper writing a text of several lines (operator timings' CSV) as a literal block."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    block = "\n" in value and "\r" not in value and not any(line != line.rstrip() for line in value.split("\n"))
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)


_BlockDumper.add_representer(str, _text)


def dump_yaml(data) -> str:
    """`data` as YAML (yaml.safe_dump, keys in order), texts of several lines as literal blocks."""
    return yaml.dump(data, Dumper=_BlockDumper, sort_keys=False, allow_unicode=False)
