"""The simulator over real loopback HTTP: vLLM protocol, PD handoff through the real vllm-router,
EPD through the built-in proxy, evidence lines, and clean teardown."""
import asyncio
import json
import re
import urllib.request

import pytest

from epdbench.specs.workload import RequestSpec, build_requests, plan_cells
from epdbench.tasks.sim import target as sim_target
from epdbench.tasks.deployment import ProvisionError
from epdbench.tasks.load.loadgen import LoadGenerator


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def sim_target_step(spec, context: int) -> float:
    """Modelled seconds of one decode step of a lone sequence (context tokens) on the spec's hardware."""
    from epdbench.physics.costmodel import CostModel
    return CostModel(spec.model, spec.hardware).step_seconds([context], [])


def emulation_counts(metrics: str) -> dict[str, float]:
    return {line.split("{")[0]: float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith(("epdbench_sim_emit_lag_seconds_count", "epdbench_sim_step_lag_seconds_count"))}


def run(endpoint, model, requests, concurrency):
    async def go():
        async with LoadGenerator(endpoint, model, timeout_s=60) as lg:
            return await lg.run_cell(requests, concurrency)
    return asyncio.run(go())


@pytest.fixture
def deploy(tiny_spec, tiny_spec_path, tmp_path):
    started = []

    def _deploy(name):
        dep = sim_target.start(tiny_spec, tiny_spec.configuration(name), tiny_spec_path, tmp_path / name)
        started.append(dep)
        return dep

    yield _deploy
    for dep in started:
        sim_target.stop(dep)
        assert all(p.popen.poll() is not None for p in dep.processes), "a process survived teardown"


def test_pd_tcp_through_vllm_router(deploy, tiny_spec):
    dep = deploy("pd-tcp")
    assert dep.router == "vllm-router"
    cell = next(c for c in plan_cells(tiny_spec) if c.kind == "fixed")
    reqs = build_requests(tiny_spec, cell)[:3]
    too_long = RequestSpec(99, "measured", "completions", {"prompt": "w " * 20000, "max_tokens": 4}, 20000, 4, "x")
    recs = run(dep.endpoint, tiny_spec.model.name, reqs + [too_long], 2)
    ok = [r for r in recs if r.ok]
    assert len(ok) == 3
    for r in ok:
        assert r.prompt_tokens == 4096 and r.output_tokens == 32 and len(r.chunk_offsets_ns) == 32
        # the decode's modelled stamps crossed the real vllm-router: tokens timed by them, arrivals kept
        assert r.timing == "modelled" and len(r.chunk_arrival_ns) == 32
        assert all(0 < m <= a for m, a in zip(r.chunk_offsets_ns, r.chunk_arrival_ns))
        gaps = [b - a for a, b in zip(r.chunk_offsets_ns[1:], r.chunk_offsets_ns[2:])]
        step = 1e9 * sim_target_step(tiny_spec, 4096)
        assert max(abs(g - step) for g in gaps) < 0.05 * step     # alone: every decode gap is the modelled step
    bad = recs[-1]
    assert not bad.ok and bad.status and bad.status >= 400      # error kept as a record
    prefill = dep.by_role("prefill")[0]
    decode = dep.by_role("decode")[0]
    # KV really crossed processes: prefill sent, decode received, for each measured request. As vLLM, each
    # leg is named by vllm-router's X-Request-Id header; the client's id is in the logged request body.
    plog, dlog = prefill.log_path.read_text(), decode.log_path.read_text()
    for r in ok:
        assert f"Request {r.request_id} JSON body: " in plog and f"Request {r.request_id} JSON body: " in dlog
        assert f"cmpl-{r.request_id}" not in plog                         # the header names the leg
    sent = re.findall(r"Sent KV of (cmpl-\S+) ", plog)
    received = re.findall(r"Received KV for (cmpl-\S+) ", dlog)
    assert len(sent) == len(received) == 4 and sorted(sent) == sorted(received)   # 3 requests and the probe
    assert "MC_FORCE_TCP is set" in plog and "[emulated by epdbench sim" in plog
    metrics = get(prefill.metrics_url)
    assert 'vllm:prompt_tokens_total{engine="0"' in metrics
    kv_bytes = next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("vllm:mooncake_bytes_transferred_sum"))
    probe_tokens = 3  # the readiness probe through the router ("epdbench readiness probe")
    assert kv_bytes == (3 * 4096 + probe_tokens) * tiny_spec.model.kv_bytes_per_token
    # Emulation lag: one observation per token the decode streamed (3 × 32; the probe does not stream), none on
    # the prefill (it streams nothing).
    emitted = emulation_counts(get(decode.metrics_url))
    assert emitted["epdbench_sim_emit_lag_seconds_count"] == 3 * 32
    assert emitted["epdbench_sim_step_lag_seconds_count"] >= 2 * 31     # two at a time: steps are shared
    assert emulation_counts(metrics)["epdbench_sim_emit_lag_seconds_count"] == 0
    tok = post(prefill.url + "/tokenize", {"prompt": "one two three"})
    assert tok["count"] == 3 and len(tok["tokens"]) == 3
    models = json.loads(get(dep.endpoint + "/v1/models"))
    assert models["data"][0]["id"] == tiny_spec.model.name


def test_epd_encodes_images_on_the_encode_role(deploy, tiny_spec):
    dep = deploy("epd")
    assert dep.router == "epdbench-proxy"
    cell = next(c for c in plan_cells(tiny_spec) if c.kind == "multimodal")
    reqs = build_requests(tiny_spec, cell)
    recs = run(dep.endpoint, tiny_spec.model.name, reqs, 2)
    assert all(r.ok for r in recs)
    assert all(r.prompt_tokens == r.target_prompt_tokens for r in recs)   # 200 text + 23 template + 400 image
    assert all(r.timing == "modelled" for r in recs)                      # stamps crossed the EPD proxy too
    enc = dep.by_role("encode")[0].log_path.read_text()
    pre = dep.by_role("prefill")[0].log_path.read_text()
    for r in recs:
        assert f"Received request chatcmpl-{r.request_id}" in enc
        assert f"ec_consumer loaded 1 encoder output(s) for chatcmpl-{r.request_id}" in pre
    assert "vllm:mm_cache_queries_total" in get(dep.by_role("encode")[0].metrics_url)


def test_epd_reuses_the_encoder_output_of_a_repeated_image(deploy, tiny_spec):
    """The mm-reuse shape (one 1792-px image, 400 text tokens) sent one request at a time: a reused image is
    encoded once, then served by the encoder cache (and its KV by the prefix caches), so its TTFT is a
    fraction of a unique image's, which needs the vision encoder, a 4.5k-token prefill and a full KV pull."""
    from epdbench.specs.models import parse_spec
    data = tiny_spec.model_dump(mode="json")
    cells = [{"name": "reuse-8k", "image_px": 1792, "text_tokens": 400, "output_tokens": 4}]
    data["suites"] = [{"kind": "multimodal", "name": name, "cells": cells, "concurrencies": [1], "n_warmup": 1,
                       "n_measured": 3, "reuse_image": name == "mm-reuse"} for name in ("mm-reuse", "mm-unique")]
    spec = parse_spec(data)
    dep = deploy("epd")
    by_suite = {c.suite: run(dep.endpoint, spec.model.name, build_requests(spec, c), 1) for c in plan_cells(spec)}
    for recs in by_suite.values():
        assert all(r.ok for r in recs) and all(r.prompt_tokens == 4096 + 400 + 23 for r in recs)
    enc = dep.by_role("encode")[0].log_path.read_text()
    reused = by_suite["mm-reuse"]
    assert f"Encoded 1 image(s) for chatcmpl-{reused[0].request_id}: 4096 tokens computed" in enc
    for r in reused[1:]:
        assert f"Encoded 1 image(s) for chatcmpl-{r.request_id}: 0 tokens computed, 1 image(s) from cache" in enc
        assert r.cached_tokens == 4096                   # the image's KV blocks, from decode's prefix cache
    for r in by_suite["mm-unique"]:
        assert f"Encoded 1 image(s) for chatcmpl-{r.request_id}: 4096 tokens computed" in enc
        assert r.cached_tokens == 0
    metrics = get(dep.by_role("encode")[0].metrics_url)
    hits = next(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("vllm:mm_cache_hits_total"))
    assert hits == 3
    ttft = {suite: sorted(r.ttft_ms for r in recs[1:])[1] for suite, recs in by_suite.items()}   # measured p50
    # cost model (virtual time): ~75 ms against ~420 ms, image preprocessing included (the reused image only
    # decoded and hashed); a 3x margin leaves room for a busy machine
    assert ttft["mm-reuse"] * 3 < ttft["mm-unique"], ttft


def test_unhealthy_process_fails_provisioning_with_reason(tiny_spec, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("not: a spec\n")
    with pytest.raises(ProvisionError) as e:
        sim_target.start(tiny_spec, tiny_spec.configuration("aggregated"), broken, tmp_path / "logs")
    assert "exited with code" in str(e.value)


def test_calibration_against_the_engines_tokenizer(deploy, tiny_spec):
    from epdbench.tasks.load.calibrate import calibrate
    dep = deploy("aggregated")
    cal = calibrate(dep.by_role("server")[0].url, tiny_spec.model.name, {("completions", None), ("chat", 560)})
    assert cal.fits["completions:0"] == (1.0, 0.0)
    assert cal.fits["chat:560"] == (1.0, 23.0 + 400.0)          # chat template + 400 image tokens
    assert cal.words_for("chat", 560, 1047, 0) == 624            # the published 1k cell


def test_prefix_cache_reuses_a_repeated_prompt_not_a_nonced_one(deploy, tiny_spec):
    dep = deploy("aggregated")
    server = dep.by_role("server")[0].url
    prompt = " ".join(["same"] * 2000)
    first = post(server + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    again = post(server + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    nonced = post(server + "/v1/completions", {"prompt": "nonce42 " + prompt, "max_tokens": 2})
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 1984     # full 16-token blocks, last recomputed
    assert nonced["usage"]["prompt_tokens_details"]["cached_tokens"] == 0       # a unique first token defeats it
    metrics = get(server + "/metrics")
    hits = next(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("vllm:prefix_cache_hits_total"))
    assert hits == 1984


def test_decode_pulls_only_the_kv_it_does_not_hold(deploy, tiny_spec):
    dep = deploy("pd-tcp")
    prefill = dep.by_role("prefill")[0]
    prompt = " ".join(["shared"] * 1024)

    def kv_bytes():
        metrics = get(prefill.metrics_url)
        return next(float(l.split()[-1]) for l in metrics.splitlines()
                    if l.startswith("vllm:mooncake_bytes_transferred_sum"))

    start = kv_bytes()
    one = post(dep.endpoint + "/v1/completions", {"model": tiny_spec.model.name, "prompt": prompt, "max_tokens": 2})
    first = kv_bytes() - start
    two = post(dep.endpoint + "/v1/completions", {"model": tiny_spec.model.name, "prompt": prompt, "max_tokens": 2})
    second = kv_bytes() - start - first
    per_token = tiny_spec.model.kv_bytes_per_token
    assert first == 1024 * per_token
    assert second == (1024 - 1008) * per_token       # decode's prefix cache held 63 full blocks of 16
    # the decode reports its prefill's prefix-cache hit (vLLM 0.33: remote_prefill_cached_tokens), not its own
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (one, two)] == [0, 1008]
    held = post(prefill.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                                  "kv_transfer_params": {"do_remote_decode": True}})
    assert held["kv_transfer_params"]["remote_prefill_cached_tokens"] == 1008
