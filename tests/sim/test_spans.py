"""sim/spans.py: the attributes of the simulator's llm_request span, in vLLM's names, from the times its path noted;
its clock as epoch ns (the host's, or the virtual one's from an anchor); the role and pod its process names."""
import json

from epdbench.otlp import POD_ATTR, ROLE_ATTR
from epdbench.sim.spans import RequestNotes, request_spans, span_resource, virtual_epoch


def test_an_encode_replica_reports_its_wait_for_the_encoder_and_the_encoder_s_own_time():
    notes = RequestNotes(trace_id="a" * 32, parent_id="b" * 16, arrival=10.0, rid="chatcmpl-x", prompt_tokens=900)
    notes.encode = (10.25, 10.5, 11.0)           # queued after preprocessing, encoder free, output ready
    (span,) = request_spans(notes, end=11.25, scale=2.0, transport="tcp")    # a replica dilated ×2
    a = span["attributes"]
    assert span["name"] == "llm_request" and span["parent_span_id"] == "b" * 16
    assert a["gen_ai.latency.time_in_queue"] == 0.125             # (10.5 − 10.25) / 2 modelled seconds
    assert a["gen_ai.latency.time_in_model_prefill"] == 0.25
    assert a["gen_ai.latency.time_to_first_token"] == 0.5
    assert a["gen_ai.latency.e2e"] == 0.625
    json.dumps(a)


def test_a_request_with_no_encoder_or_engine_notes_carries_only_what_was_seen():
    notes = RequestNotes(trace_id="a" * 32, parent_id="b" * 16, arrival=1.0, rid="cmpl-y")
    (span,) = request_spans(notes, end=1.5, scale=1.0, transport="tcp")
    assert "gen_ai.latency.time_in_queue" not in span["attributes"]
    assert span["attributes"]["gen_ai.latency.e2e"] == 0.5


def test_on_a_virtual_clock_spans_are_epoch_ns_from_the_anchor_and_carry_a_kv_pull():
    anchor = 1_700_000_000_000_000_000
    notes = RequestNotes(trace_id="a" * 32, parent_id="b" * 16, arrival=2.0, rid="cmpl-z", prompt_tokens=10)
    notes.kv = (2.25, 2.5, 9, True)
    llm, kv = request_spans(notes, end=3.0, scale=1.0, transport="rdma", epoch=virtual_epoch(anchor))
    assert (llm["start_ns"], llm["end_ns"]) == (anchor + 2_000_000_000, anchor + 3_000_000_000)
    assert (kv["name"], kv["start_ns"], kv["end_ns"]) == ("kv_transfer", anchor + 2_250_000_000, anchor + 2_500_000_000)
    assert kv["attributes"]["epdbench.kv.seconds"] == 0.25 and kv["parent_span_id"] == "b" * 16


def test_a_replica_s_resource_names_its_role_as_the_contract_does_and_the_proxy_its_own():
    assert span_resource("server", 0) == {"service.name": "server-0", ROLE_ATTR: "aggregated", POD_ATTR: "server-0"}
    assert span_resource("decode", 1)[ROLE_ATTR] == "decode"
    assert span_resource("proxy") == {"service.name": "router", ROLE_ATTR: "proxy", POD_ATTR: "router"}
