"""The differential's comparison, without engines: answers reduced and compared, /metrics samples, anchored log
lines, and the known-differences list (new ones and stale ones), on small documents and the captured real engine."""
from __future__ import annotations

import json

import pytest
import yaml

from epdbench.analysis.differential import (Difference, Known, check_known, compare_answers, compare_exchanges,
                                            compare_logs, compare_metrics, known_from, reduce_answer)
from epdbench.analysis.probes import probes
from tests.differential_client import KNOWN, read_capture


def answer(doc: dict, status: int = 200) -> dict:
    return reduce_answer(status, "application/json", json.dumps(doc))


def sse(*chunks, done: bool = True) -> dict:
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + ("data: [DONE]\n\n" if done else "")
    return reduce_answer(200, "text/event-stream", text)


def test_text_ids_and_token_counts_differ_without_a_difference_but_finish_reason_and_usage_do_not():
    def usage(prompt, completion, cached):
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "prompt_tokens_details": {"cached_tokens": cached}}
    real = answer({"id": "cmpl-a", "choices": [{"index": 0, "text": "xyz", "finish_reason": "length"}],
                   "usage": usage(20, 4, 0)})
    same = answer({"id": "cmpl-b", "choices": [{"index": 0, "text": "the", "finish_reason": "length"}],
                   "usage": usage(5, 4, 0)})
    assert compare_answers("p", real, same) == []
    other = answer({"id": "cmpl-b", "choices": [{"index": 0, "text": "the", "finish_reason": "stop"}],
                    "usage": usage(5, 3, 16)})
    assert {d.what for d in compare_answers("p", real, other)} == {
        "values:choices[].finish_reason", "values:usage.completion_tokens",
        "values:usage.prompt_tokens_details.cached_tokens"}


def test_a_null_field_and_an_absent_one_read_the_same_but_a_missing_value_does_not():
    real = answer({"object": "x", "logprobs": None, "system_fingerprint": "vllm-0.32.0"})
    diffs = compare_answers("p", real, answer({"object": "x"}))
    assert [(d.what, d.real, d.sim) for d in diffs] == [("types:system_fingerprint", "string", "(absent)")]


def test_error_bodies_compare_status_type_param_and_code_not_the_message():
    real = answer({"error": {"message": "a", "type": "Bad Request", "param": "body.messages", "code": 400}}, 400)
    sim = answer({"error": {"message": "b", "type": "BadRequestError", "param": "messages", "code": 400}}, 400)
    assert {d.what for d in compare_answers("bad", real, sim)} == {"values:error.type", "values:error.param"}
    assert compare_answers("bad", real, answer({"error": {"message": "c", "type": "Bad Request",
                                                           "param": "body.messages", "code": 400}}, 400)) == []


def test_streams_compare_chunk_kinds_their_order_the_usage_chunk_and_done():
    first = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    content = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}
    final = {"choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    real = sse(first, content, final, usage)
    assert real["order"] == ["first", "content", "final", "usage"] and real["done"]
    assert compare_answers("s", real, sse(first, content, content, final, usage)) == []
    diffs = {d.what: (d.real, d.sim) for d in compare_answers("s", real, sse(first, content, final, done=False))}
    assert diffs == {"done": (True, False), "order": (["first", "content", "final", "usage"],
                                                      ["first", "content", "final"])}


METRICS_REAL = """# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 10.0
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 0.0
"""


def test_metrics_compare_the_samples_the_pipeline_reads_their_type_line_and_labels():
    assert compare_metrics(METRICS_REAL, METRICS_REAL) == []
    sim = METRICS_REAL.replace("# TYPE vllm:prompt_tokens_total counter", "# TYPE vllm:prompt_tokens counter")
    sim = sim.replace('vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"}', "vllm:nixl_bytes_transferred_sum")
    diffs = {d.what: (d.real, d.sim) for d in compare_metrics(METRICS_REAL, sim)}
    assert diffs == {"vllm:prompt_tokens_total.declared": ("vllm:prompt_tokens_total counter",
                                                           "vllm:prompt_tokens counter"),
                     "vllm:nixl_bytes_transferred_sum.labels": (["engine", "model_name"], [])}
    gone = compare_metrics(METRICS_REAL, METRICS_REAL.split("# TYPE vllm:nixl")[0])
    assert [(d.what, d.sim) for d in gone] == [("vllm:nixl_bytes_transferred_sum", "(absent)")]


def test_logs_compare_the_anchored_request_lines_per_probe_and_the_access_lines():
    real = ["(APIServer pid=1) DEBUG 12-04 12:24:18 [request_logger.py:74] Request diff-a JSON body: {}",
            "(APIServer pid=1) INFO 12-04 12:24:18 [request_logger.py:65] Received request cmpl-diff-a-0: params: x",
            "(APIServer pid=1) DEBUG 12-04 12:24:18 [request_logger.py:74] Request diff-b JSON body: {}",
            "Received request cmpl-diff-b-0: params: x"]          # not in vLLM's format: never an anchor
    sim = ["(APIServer pid=2) INFO 12-04 12:24:18 [request_logger.py:86] Request diff-a JSON body: {}",
           "(APIServer pid=2) INFO 12-04 12:24:18 [request_logger.py:67] Received request cmpl-diff-a-0: params: y",
           "(APIServer pid=2) INFO 12-04 12:24:18 [request_logger.py:86] Request diff-b JSON body: {}",
           '(APIServer pid=2) INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/1.1" 200 OK']
    diffs = {d.what: (d.real, d.sim) for d in compare_logs(real, sim, ["a", "b"])}
    assert diffs == {"access": ("(none)", ["POST /v1/completions 200"])}


def test_known_differences_flag_the_unlisted_and_the_stale():
    found = [Difference("n-2", "status", 200, 400), Difference("chat", "types:x", "string", "(absent)")]
    verdict = check_known(found, [Known("n-2", "*", "one choice"), Known("logs", "access", "none written")])
    assert [d.where for d in verdict.unlisted] == ["chat"] and [k.what for k in verdict.stale] == ["access"]
    assert not verdict.ok and verdict.lines()[0].startswith("not listed: chat: types:x")


@pytest.mark.parametrize("doc, field", [({"differences": [{"where": "a", "what": "b"}]}, "`reason`"),
                                        ({"differences": [{"where": "a", "what": "b", "reason": "r", "x": 1}]},
                                         "unknown keys"),
                                        ({"diffs": []}, "`differences`")])
def test_a_malformed_known_differences_file_is_one_line_naming_the_entry_and_field(doc, field):
    with pytest.raises(ValueError, match=field):
        known_from(doc)


def test_the_captured_real_engine_against_itself_differs_in_nothing_and_the_list_has_a_reason_for_each_entry():
    real = read_capture()
    assert list(real["answers"]) == [p.name for p in probes("m", 1)]
    assert compare_exchanges(real, real) == []
    known = known_from(yaml.safe_load(KNOWN.read_text()))
    assert known and all(len(k.reason) > 40 for k in known)
    assert real["answers"]["prefix-repeat"]["status"] == 200          # the repeat was served from the prefix cache
    usage = json.loads(real["answers"]["prefix-repeat"]["text"])["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
