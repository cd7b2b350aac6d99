"""W3C trace context and OTLP trace messages (pure: ids, the `traceparent` header, the protobuf body of an OTLP
`/v1/traces` export, both ways). The load generator, the simulator's processes and the run's receiver speak it;
real vLLM (`--otlp-traces-endpoint`, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf) sends the same body.

A span here is a plain dict: trace_id (32 hex), span_id (16 hex), parent_span_id (16 hex or ""), name,
start_ns, end_ns (unix epoch ns), attributes (dict of str → str/int/float/bool) and resource (the exporting
process's resource attributes: `service.name`, and `epdbench.role` / `epdbench.pod` where the run set them).
"""
from __future__ import annotations

import random
import re

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
ROLE_ATTR, POD_ATTR = "epdbench.role", "epdbench.pod"     # resource attributes naming the exporting process
EMULATED_ATTR = "epdbench.emulated"                        # a span attribute: the simulator made this span
_rand = random.SystemRandom()


def new_trace_id() -> str:
    return f"{_rand.getrandbits(128) or 1:032x}"


def new_span_id() -> str:
    return f"{_rand.getrandbits(64) or 1:016x}"


def format_traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    """The W3C header of a span: `00-<trace>-<span>-01` (flags 01: sampled)."""
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def parse_traceparent(header: str | None) -> tuple[str, str] | None:
    """(trace id, parent span id) of a version-00 `traceparent`, or None when absent, malformed or all zeros."""
    m = TRACEPARENT.match((header or "").strip().lower())
    if not m or set(m.group(1)) == {"0"} or set(m.group(2)) == {"0"}:
        return None
    return m.group(1), m.group(2)


def _any(v) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=str(v))


def _value(v: AnyValue):
    kind = v.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(v, kind)
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return None


def _kvs(d: dict) -> list[KeyValue]:
    return [KeyValue(key=k, value=_any(v)) for k, v in d.items() if v is not None]


def encode_spans(spans: list[dict], resource: dict, scope: str = "epdbench") -> bytes:
    """An OTLP ExportTraceServiceRequest body holding `spans`, all from one process with `resource`."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(_kvs(resource))
    ss = rs.scope_spans.add()
    ss.scope.name = scope
    for s in spans:
        ss.spans.append(PbSpan(
            trace_id=bytes.fromhex(s["trace_id"]), span_id=bytes.fromhex(s["span_id"]),
            parent_span_id=bytes.fromhex(s["parent_span_id"]) if s.get("parent_span_id") else b"",
            name=s["name"], kind=PbSpan.SPAN_KIND_SERVER if s.get("server", True) else PbSpan.SPAN_KIND_CLIENT,
            start_time_unix_nano=int(s["start_ns"]), end_time_unix_nano=int(s["end_ns"]),
            attributes=_kvs(s.get("attributes") or {})))
    return req.SerializeToString()


def decode_spans(body: bytes) -> list[dict]:
    """Every span of an OTLP ExportTraceServiceRequest body, with its process's resource attributes.
    Raises ValueError on a body that is not one."""
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except Exception as e:   # protobuf's DecodeError
        raise ValueError(f"not an OTLP trace export: {e}") from None
    out = []
    for rs in req.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append({"trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(), "name": s.name,
                            "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano,
                            "attributes": {kv.key: _value(kv.value) for kv in s.attributes},
                            "resource": resource})
    return out
