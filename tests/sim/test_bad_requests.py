"""Bad requests answered as vLLM answers them: the pure checks, then the official OpenAI SDK against one
simulated replica over loopback (the SDK's own exception classes prove the status and error shape)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from epdbench.sim.validate import check_body, request_id_of
from epdbench.tasks import sim_target

MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"


@pytest.mark.parametrize("body, chat, status, param, text", [
    ([1, 2], False, 400, None, "valid dictionary"),
    ({"model": "gpt-4", "prompt": "hi"}, False, 404, "model", "The model `gpt-4` does not exist"),
    ({"prompt": "hi", "max_tokens": 0}, False, 400, "max_tokens", "max_tokens must be at least 1, got 0."),
    ({"prompt": "hi", "max_tokens": -3}, False, 400, "max_tokens", "at least 1, got -3"),
    ({"prompt": "hi", "max_tokens": "8"}, False, 400, "max_tokens", "valid integer"),
    ({"prompt": "hi", "max_tokens": True}, False, 400, "max_tokens", "valid integer"),
    ({"messages": [], "max_completion_tokens": 0}, True, 400, "max_completion_tokens", "at least 1"),
    ({"prompt": "hi", "n": 2}, False, 400, "n", "n must be 1 on the simulator"),
    ({"prompt": "hi", "n": 0}, False, 400, "n", "n must be at least 1"),
    ({"max_tokens": 4}, False, 400, "prompt", "prompt: Field required"),
    ({"messages": "hi"}, True, 400, "messages", "messages"),
])
def test_bad_bodies_get_vllms_status_type_and_parameter(body, chat, status, param, text):
    problem = check_body(body, MODEL, chat)
    assert problem is not None and problem.status == status and problem.param == param and text in problem.message
    err = problem.body()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


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
    assert "prompt cannot be empty" in e.value.body["message"]
    for raw in (b"[1, 2]", b'{"model": "%s", "prompt": "hi", "max_tokens": "x"}' % model.encode()):
        req = urllib.request.Request(replica + "/v1/completions", data=raw, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and json.loads(e.value.read())["error"]["type"] == "BadRequestError"
    ok = client.completions.create(model=model, prompt="hello there", max_tokens=3,
                                   extra_headers={"X-Request-Id": "hdr-1"}, extra_body={"request_id": "body-1"})
    assert ok.id == "cmpl-hdr-1" and ok.usage.completion_tokens == 3       # served, header id first
