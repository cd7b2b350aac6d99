"""epdbench.otlp: the W3C traceparent both ways and OTLP trace bodies encoded and decoded."""
import pytest

from epdbench.otlp import (EMULATED_ATTR, decode_spans, encode_spans, format_traceparent, new_span_id, new_trace_id,
                           parse_traceparent)


def test_traceparent_round_trip_and_w3c_format():
    t, s = new_trace_id(), new_span_id()
    header = format_traceparent(t, s)
    assert header == f"00-{t}-{s}-01" and len(t) == 32 and len(s) == 16
    assert parse_traceparent(header) == (t, s)


@pytest.mark.parametrize("bad", [None, "", "00-abc-def-01", "01-" + "a" * 32 + "-" + "b" * 16 + "-01",
                                 "00-" + "0" * 32 + "-" + "b" * 16 + "-01", "00-" + "a" * 32 + "-" + "0" * 16 + "-01"])
def test_malformed_or_zero_traceparent_is_none(bad):
    assert parse_traceparent(bad) is None


def test_spans_survive_an_otlp_body_with_their_resource():
    t = new_trace_id()
    spans = [{"trace_id": t, "span_id": new_span_id(), "parent_span_id": new_span_id(), "name": "llm_request",
              "start_ns": 1_700_000_000_000_000_000, "end_ns": 1_700_000_000_250_000_000,
              "attributes": {"gen_ai.latency.time_in_queue": 0.125, "gen_ai.usage.prompt_tokens": 7,
                             "gen_ai.request.id": "cmpl-x", EMULATED_ATTR: True}}]
    out = decode_spans(encode_spans(spans, {"service.name": "decode-0", "epdbench.role": "decode"}))
    assert len(out) == 1
    got = out[0]
    for k in ("trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns", "attributes"):
        assert got[k] == spans[0][k], k
    assert got["resource"] == {"service.name": "decode-0", "epdbench.role": "decode"}


def test_a_body_that_is_not_otlp_is_a_value_error():
    with pytest.raises(ValueError, match="not an OTLP trace export"):
        decode_spans(b"\xff\xff\xff\xff")
