"""analysis/stages.py: every measured request at every stage, from real-format lines and vLLM's counters."""
from __future__ import annotations

from epdbench.analysis.stages import local_prefills, stage_counts, verify_stages


def access(status: int = 200, chat: bool = False) -> str:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    reason = "OK" if status == 200 else "Internal Server Error"
    return f'(APIServer pid=782545) INFO:     10.35.102.36:52864 - "POST {path} HTTP/1.1" {status} {reason}'


def received(rid: str, chat: bool = False) -> str:
    prefix = "chatcmpl" if chat else "cmpl"
    return f"(APIServer pid=782545) INFO 07-13 16:33:58 [logger.py:49] Received request {prefix}-{rid}: role=decode"


def test_stage_counts_of_access_and_request_lines():
    c = stage_counts([received("r1"), access(200), received("r2", chat=True), access(200, chat=True), access(500),
                      '(APIServer pid=1) INFO:     1.2.3.4:5 - "GET /health HTTP/1.1" 200 OK',
                      '(APIServer pid=1) INFO:     1.2.3.4:5 - "POST /tokenize HTTP/1.1" 200 OK'])
    assert (c["completions"], c["errors"], c["renders"], c["request_ids"]) == (2, 1, 1, {"r1", "r2"})


def test_vllm_0_33_request_lines_name_the_request():
    # serve/utils/request_logger.py: log_inputs (a completion's id carries its choice index) and log_request_body
    lines = ["(APIServer pid=7) INFO 12-04 05:00:00 [request_logger.py:67] Received request cmpl-epd-r1-0: params: "
             "SamplingParams(n=1, presence_penalty=0.0, ignore_eos=True, max_tokens=64, extra_args={'kv_transfer_"
             "params': {'do_remote_prefill': True}}), lora_request: None.",
             "(APIServer pid=7) INFO 12-04 05:00:00 [request_logger.py:67] Received request chatcmpl-epd-r2: params: "
             "SamplingParams(n=1, max_tokens=8), lora_request: None.",
             '(APIServer pid=7) INFO 12-04 05:00:00 [request_logger.py:86] Request epd-r3 JSON body: {"prompt":"x"}']
    assert stage_counts(lines)["request_ids"] >= {"epd-r1", "epd-r2", "epd-r3"}


def test_request_ids_and_access_text_inside_other_lines_do_not_count():
    quoted = ("(APIServer pid=1) INFO 07-13 16:33:58 [logger.py:49] Received request cmpl-r9: prompt: "
              "'Received request cmpl-r7: INFO:     1.2.3.4:5 - \"POST /v1/completions HTTP/1.1\" 200 OK'")
    other_file = "(APIServer pid=1) INFO 07-13 16:33:58 [api_server.py:12] Received request cmpl-r8: echo"
    c = stage_counts([quoted, other_file, "Received request cmpl-r6: bare"])
    assert (c["completions"], c["request_ids"]) == (0, {"r9"})


def test_verify_stages_all_seen():
    expected = {"r1": ["prefill", "decode"], "r2": ["encode", "prefill", "decode"]}
    counts = {"encode": stage_counts([received("r2", chat=True)]),
              "prefill": stage_counts([received("r1"), received("r2", chat=True)]),
              "decode": stage_counts([received("r1"), received("r2", chat=True)])}
    deltas = {"decode": {"prompt_tokens_local_compute": 2, "requests_finished": 2,
                         "prompt_tokens_external_kv_transfer": 4000}}
    assert verify_stages(expected, counts, emulated=False, metrics_delta=deltas)["verdict"] == "verified"
    v = verify_stages(expected, counts, emulated=True, metrics_delta=deltas)
    assert v["verdict"] == "emulated"
    assert v["fraction_seen"] == {"decode": 1.0, "encode": 1.0, "prefill": 1.0}
    assert v["skipped"] == [] and v["n_skipped"] == 0
    assert v["local_prefill"]["excess_tokens"] == 0


def test_request_missing_at_decode_is_a_mismatch():
    expected = {"r1": ["prefill", "decode"], "r2": ["prefill", "decode"]}
    counts = {"prefill": stage_counts([received("r1"), received("r2")]), "decode": stage_counts([received("r1")])}
    v = verify_stages(expected, counts, emulated=True)
    assert v["verdict"] == "mismatch"
    assert v["skipped"] == [{"request_id": "r2", "missing_role": "decode"}]
    assert v["fraction_seen"]["decode"] == 0.5
    assert any(r.startswith("decode:") for r in v["reasons"])


def test_prefill_done_on_decode_shows_in_vllm_counters():
    """All ids seen everywhere, yet a decode pod computed whole prompts itself: the router skipped prefill."""
    expected = {"r1": ["prefill", "decode"], "r2": ["prefill", "decode"]}
    counts = {role: stage_counts([received("r1"), received("r2")]) for role in ("prefill", "decode")}
    deltas = {"decode": {"prompt_tokens_local_compute": 1 + 2048, "requests_finished": 2,
                         "prompt_tokens_external_kv_transfer": 2047}}
    v = verify_stages(expected, counts, emulated=False, metrics_delta=deltas)
    assert v["verdict"] == "mismatch"
    assert v["local_prefill"]["excess_tokens"] == 2047
    assert any("prefilled on a decode pod without KV transfer" in r for r in v["reasons"])


def test_without_decode_counters_local_prefills_are_said_to_be_unchecked():
    expected = {"r1": ["prefill", "decode"]}
    counts = {role: stage_counts([received("r1")]) for role in ("prefill", "decode")}
    v = verify_stages(expected, counts, emulated=False, metrics_delta={})
    assert v["verdict"] == "verified"
    assert any("local prefills not checked" in r for r in v["reasons"])
    assert local_prefills({"decode": {"requests_finished": 3}}) is None


def test_no_measured_requests_is_no_evidence():
    assert verify_stages({}, {}, emulated=True)["verdict"] == "no-evidence"


def test_real_vllm_completions_request_line_matches_the_client_id():
    rid = "epd-1a2b3c4d-m0-9f8e7d"
    line = (f"(APIServer pid=428) INFO 07-13 16:33:58 [logger.py:49] Received request cmpl-{rid}-0: "
            "prompt: 'alpha bravo', params: SamplingParams(n=1, max_tokens=64), prompt_token_ids: None, "
            "lora_request: None.")
    v = verify_stages({rid: ["server"]}, {"server": stage_counts([line])}, emulated=False)
    assert v["verdict"] == "verified"
