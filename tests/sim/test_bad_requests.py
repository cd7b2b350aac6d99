"""Bad requests answered as vLLM answers them: the pure checks, then the official OpenAI SDK against one
simulated replica over loopback (the SDK's own exception classes prove the status and error shape)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from epdbench.sim.validate import BadRequest, check_body, output_budget, request_id_of
from epdbench.tasks.sim import target as sim_target

MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"


@pytest.mark.parametrize("body, chat, status, param, text", [
    ([1, 2], False, 400, None, "valid dictionary"),
    ({"model": "gpt-4", "prompt": "hi"}, False, 404, "model", "The model `gpt-4` does not exist"),
    ({"prompt": "hi", "max_tokens": "8"}, False, 400, "body.max_tokens", "'int_parsing', 'loc': 'body.max_tokens'"),
    ({"prompt": "hi", "max_tokens": True}, False, 400, "body.max_tokens", "valid integer"),
    ({"messages": [], "max_completion_tokens": 2.5}, True, 400, "body.max_completion_tokens", "valid integer"),
    ({"prompt": "hi", "n": 2}, False, 400, "n", "n must be 1 on the simulator"),
    ({"prompt": "hi", "n": 0}, False, 400, None, "n must be at least 1, got 0."),
    ({"max_tokens": 4}, False, 400, "prompt", "Either prompt or prompt_embeds must be provided and non-empty."),
    ({"prompt": "", "max_tokens": 4}, False, 400, "prompt", "Either prompt or prompt_embeds"),
    ({"max_tokens": 4}, True, 400, "body.messages", "'type': 'missing', 'loc': 'body.messages'"),
    ({"messages": "hi"}, True, 400, "body.messages", "'type': 'list_type', 'loc': 'body.messages'"),
    ({"prompt": "hi", "temperature": -1}, False, 400, "temperature",
     "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)"),
])
def test_bad_bodies_get_vllms_status_type_and_parameter(body, chat, status, param, text):
    problem = check_body(body, MODEL, chat)
    assert problem is not None and problem.status == status and problem.param == param and text in problem.message
    err = problem.body()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    # vLLM 0.32: a body its request model refuses is a `Bad Request` naming `body.<field>` (the differential's capture)
    assert err["type"] == ("NotFoundError" if status == 404 else "Bad Request" if (param or "").startswith("body.")
                           else "BadRequestError")


@pytest.mark.parametrize("body, chat, prompt, message, param", [
    # more output asked than the whole context: refused before the prompt is read
    ({"max_tokens": 2049}, False, 10, "max_tokens=2049 cannot be greater than max_model_len=2048. Please request "
     "fewer output tokens. (parameter=max_tokens, value=2049)", "max_tokens"),
    ({"max_completion_tokens": 4096, "max_tokens": 8}, True, 10, "max_completion_tokens=4096 cannot be greater",
     "max_completion_tokens"),
    # a prompt longer than the context; the tokenizer stops counting one token past it
    ({"max_tokens": 4}, False, 2049, "This model's maximum context length is 2048 tokens. However, your prompt "
     "contains at least 2049 input tokens, which exceeds this limit even without any output tokens. Please reduce "
     "the length of the input prompt. (parameter=input_tokens, value=2049)", "input_tokens"),
    ({"max_tokens": 4}, False, 9000, "contains at least 2049 input tokens", "input_tokens"),
    # fewer than one token: asked, or all the context has left (a prompt that fills it)
    ({"max_tokens": 0}, False, 10, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
     "max_tokens"),
    ({"max_tokens": -3}, False, 10, "max_tokens must be at least 1, got -3.", "max_tokens"),
    ({"max_completion_tokens": 0}, True, 10, "max_tokens must be at least 1, got 0.", "max_tokens"),
    ({"max_tokens": 4}, False, 2048, "max_tokens must be at least 1, got 0.", "max_tokens"),
])
def test_length_refusals_are_vllms_in_its_order(body, chat, prompt, message, param):
    problem = output_budget(body, chat, prompt, 2048)
    assert isinstance(problem, BadRequest) and message in problem.message and problem.param == param
    assert problem.status == 400 and problem.type == "BadRequestError"


@pytest.mark.parametrize("body, chat, prompt, tokens", [
    ({}, False, 100, 16),                                  # completions: 16 when max_tokens is absent
    ({"max_tokens": None}, False, 100, 1948),              # null: all the context has left
    ({}, True, 100, 1948),                                 # chat: none asked is all that is left
    ({"max_tokens": 64}, True, 100, 64),
    ({"max_tokens": 64, "max_completion_tokens": 8}, True, 100, 8),    # chat's newer field first
    ({"max_tokens": 2000}, False, 100, 1948),              # more than is left: served, cut (it stops early)
    ({"max_tokens": 1}, False, 2047, 1),
])
def test_a_request_may_generate_what_it_asks_cut_to_what_the_context_has_left(body, chat, prompt, tokens):
    assert output_budget(body, chat, prompt, 2048) == tokens


def test_good_bodies_pass_and_the_header_names_the_request_first():
    assert check_body({"model": MODEL, "prompt": "hi", "max_tokens": 4, "n": 1}, MODEL, False) is None
    assert check_body({"prompt": "hi"}, MODEL, False) is None                     # no model: the served one
    assert check_body({"messages": [], "max_completion_tokens": 3}, MODEL, True) is None
    assert request_id_of("from-header", {"request_id": "from-body"}) == "from-header"
    assert request_id_of(None, {"request_id": "from-body"}) == "from-body"


@pytest.fixture
def replica(tiny_spec, tiny_spec_path, tmp_path):
    dep = sim_target.start(tiny_spec, tiny_spec.configuration("aggregated"), tiny_spec_path, tmp_path / "agg")
    try:
        yield next(p for p in dep.processes if p.role == "server").url
    finally:
        sim_target.stop(dep)


def test_the_openai_sdk_sees_vllms_errors_and_the_replica_keeps_serving(replica, tiny_spec):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=replica + "/v1", api_key="none", max_retries=0, timeout=20)
    model = tiny_spec.model.name
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="not-served", prompt="hi", max_tokens=4)
    assert e.value.body["param"] == "model" and "does not exist" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="hi", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="hi", max_tokens=4, n=2)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:                 # vLLM: 400, never a request that hangs
        client.completions.create(model=model, prompt="", max_tokens=4)
    assert e.value.body["param"] == "prompt" and "non-empty" in e.value.body["message"]
    context = tiny_spec.engine.max_model_len                         # one token per word (sim.tokenizer)
    cut = client.completions.create(model=model, prompt=" ".join(["w"] * (context - 4)), max_tokens=10)
    assert cut.usage.completion_tokens == 4 and cut.choices[0].finish_reason == "length"   # served, cut short
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt=" ".join(["w"] * (context + 9)), max_tokens=1)
    assert e.value.body["param"] == "input_tokens" and f"at least {context + 1} input tokens" in e.value.body["message"]
    for raw, kind in ((b"[1, 2]", "BadRequestError"), (b'{"model": "m", "prompt": ', "Bad Request"),
                      (b'{"model": "%s", "prompt": "hi", "max_tokens": "x"}' % model.encode(), "Bad Request")):
        req = urllib.request.Request(replica + "/v1/completions", data=raw, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and json.loads(e.value.read())["error"]["type"] == kind
    ok = client.completions.create(model=model, prompt="hello there", max_tokens=3,
                                   extra_headers={"X-Request-Id": "hdr-1"}, extra_body={"request_id": "body-1"})
    assert ok.id == "cmpl-hdr-1" and ok.usage.completion_tokens == 3       # served, header id first
