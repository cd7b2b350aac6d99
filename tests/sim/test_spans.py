"""sim/spans.py: the attributes of the simulator's llm_request span, in vLLM's names, from the times its path noted."""
import json

from epdbench.sim.spans import RequestNotes, request_spans


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
