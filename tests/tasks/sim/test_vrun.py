"""A spec run in virtual time: deterministic, in the records' format, with the HTTP simulator's physics."""
import asyncio

import pandas as pd
import pytest

from epdbench.analysis.metrics import summarize
from epdbench.physics.costmodel import CostModel, image_tokens, link_bytes_per_s, setup_seconds, transfer_seconds
from epdbench.sim import apiserver, vloop
from epdbench.sim.link import Link
from epdbench.sim.vcluster import VirtualCluster
from epdbench.specs import workload as specs_workload
from epdbench.tasks.sim import vrun
from epdbench.tasks.rundir.results import append_records, read_records
from epdbench.tasks.sim.vrun import prompt_calibration, simulate_configuration, simulate_records, simulate_summary


def only(spec, configs, suites=None, **updates):
    return spec.model_copy(update={"configurations": [c for c in spec.configurations if c.name in configs],
                                   **({"suites": [s for s in spec.suites if s.name in suites]} if suites else {}),
                                   **updates})


def test_the_same_spec_gives_the_same_figures_and_every_request_is_served(tiny_spec):
    a = simulate_summary(tiny_spec)
    assert a.astype(str).equals(simulate_summary(tiny_spec).astype(str))
    assert sorted(a["config"].unique()) == ["aggregated", "epd", "pd-rdma", "pd-tcp"]
    assert (a["requests_ok"] == a["requests_total"]).all() and (a["timing"] == "modelled").all()


def test_records_have_the_results_folder_format(tiny_spec, tmp_path):
    spec = only(tiny_spec, {"pd-tcp"})
    rows = simulate_configuration(spec, spec.configurations[0], prompt_calibration(spec))
    records = pd.DataFrame(rows)
    path = tmp_path / "records.parquet"
    append_records(path, rows)
    back = read_records(path)
    assert len(back) == len(records) and back["request_id"].is_unique
    assert summarize(back).astype(str).equals(summarize(records).astype(str))
    measured = back[back["phase"] == "measured"]
    assert (measured["prompt_tokens"] == measured["target_prompt_tokens"]).all()   # calibrated to the tokenizer
    assert (measured["output_tokens"] == measured["max_tokens"]).all()


def test_pd_ttft_differs_between_transports_by_exactly_the_kv_transfer(tiny_spec):
    spec = only(tiny_spec, {"pd-tcp", "pd-rdma"}, {"fixed"})
    spec = spec.model_copy(update={"suites": [spec.suites[0].model_copy(update={"concurrencies": [1]})]})
    s = simulate_summary(spec).set_index("config")
    rec = simulate_records(only(spec, {"pd-tcp"}))
    prompt = int(rec["prompt_tokens"].iloc[0])
    cost = CostModel(spec.model, spec.hardware, 1)
    kv, n_desc = cost.kv_bytes(prompt), cost.kv_descriptors
    pd_tcp = next(c for c in spec.configurations if c.name == "pd-tcp")
    expected = (transfer_seconds(spec.hardware, "tcp", kv, 1, n_desc)
                - transfer_seconds(spec.hardware, "rdma", kv, 1, n_desc)) * 1e3
    assert s.loc["pd-tcp", "ttft_p50_ms"] - s.loc["pd-rdma", "ttft_p50_ms"] == pytest.approx(expected, abs=1e-3)
    assert pd_tcp.kv_transport == "tcp" and expected > 50          # 4096 tokens of KV over 3 GB/s TCP


def test_a_refused_request_and_a_timed_out_one_are_failures_on_record(tiny_spec):
    spec = only(tiny_spec, {"aggregated"}, {"fixed"})
    too_long = spec.model_copy(update={"engine": spec.engine.model_copy(update={"max_model_len": 1024})})
    rec = simulate_records(too_long)
    assert (rec["status"] == 400).all() and not rec["ok"].any()
    assert rec["error"].str.startswith("HTTP 400: This model's maximum context length is 1024 tokens").all()
    # the same requests again: a parse kept from the run before must not carry its refusal
    tight = spec.model_copy(update={"engine": spec.engine.model_copy(update={"max_model_len": 4100})})
    rec = simulate_records(tight)              # 4096-token prompts asking 32 tokens: vLLM serves the 4 that fit
    assert rec["ok"].all() and (rec["prompt_tokens"] + rec["output_tokens"] == 4100).all()
    assert (rec["output_tokens"] < rec["max_tokens"]).all()                 # the report counts them as early stops
    slow = spec.model_copy(update={"request_timeout_s": 0.05})      # a 4096-token prefill takes longer
    rec = simulate_records(slow)
    assert not rec["ok"].any() and rec["error"].str.startswith("timeout after").all()
    assert len(rec) == 9                                              # 1 warm-up + 8 measured, none lost


def test_a_cached_image_is_not_encoded_again(tiny_spec):
    s = simulate_summary(only(tiny_spec, {"aggregated", "epd"}, {"mm", "mm-reuse"})).set_index(["config", "suite"])
    for config in ("aggregated", "epd"):       # the shared image is encoded once: the second request is faster
        assert s.loc[(config, "mm-reuse"), "ttft_p50_ms"] < s.loc[(config, "mm"), "ttft_p50_ms"]
    assert isinstance(s, pd.DataFrame)


def test_a_bigger_image_reaches_its_first_token_later_by_its_modelled_preprocessing(tiny_spec):
    mm = next(s for s in tiny_spec.suites if s.name == "mm")
    mm = mm.model_copy(update={"concurrencies": [1], "cells": [
        mm.cells[0], mm.cells[0].model_copy(update={"name": "big", "image_px": 1120})]})
    spec = only(tiny_spec, {"aggregated", "pd-tcp", "epd"}).model_copy(update={"suites": [mm]})

    def ttft(ms: float, ms_per_mp: float) -> pd.Series:
        hw = spec.hardware.model_copy(update={"image_preprocess_ms": ms, "image_preprocess_ms_per_mp": ms_per_mp})
        s = simulate_summary(spec.model_copy(update={"hardware": hw}))
        return s.set_index(["config", "workload"])["ttft_p50_ms"]
    extra = ttft(3.0, 40.0) - ttft(0.0, 0.0)
    for config, servers in (("aggregated", 1), ("pd-tcp", 2), ("epd", 3)):   # by every API server on the path
        assert extra[(config, "1k:560px+200/8")] == pytest.approx(servers * (3.0 + 40.0 * 0.3136), abs=1e-6)
        assert extra[(config, "big:1120px+200/8")] == pytest.approx(servers * (3.0 + 40.0 * 1.2544), abs=1e-6)



def kv_transfers(spec, config, monkeypatch) -> tuple[list[tuple[float, float]], int]:
    """(start, end) of each KV transfer, and the prompt length, when two PD requests of the same length arrive
    together, served by sim.vcluster on the virtual-time loop: both prefills end in the same engine step, so their
    KV transfers start together (without the tokenizer and the output path, which take them one after the
    other)."""
    spec = spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"tokenize_us_per_token": 0.0,
                                                                                "output_us_per_token": 0.0})})
    log = []
    send = Link.send

    async def logged(self, setup_s, link_s, peer=None, lanes=0):
        t0 = asyncio.get_running_loop().time()
        await send(self, setup_s, link_s, peer, lanes)
        if peer is not None:                                          # KV (encoder outputs go without a peer)
            log.append((t0, asyncio.get_running_loop().time()))
    monkeypatch.setattr(Link, "send", logged)

    async def main():
        cluster = VirtualCluster(spec, config)
        cluster.start()
        prompts = [cluster.parse("completions", {"prompt": " ".join(f"w{i}n{k}" for k in range(2000)),
                                                 "max_tokens": 2}) for i in range(2)]
        await asyncio.gather(*(cluster.generate(f"r{i}", p, []) for i, p in enumerate(prompts)))
        await cluster.stop()
        return len(prompts[0].ids)
    n_tokens = vloop.run(main())
    return sorted(log), n_tokens


@pytest.mark.parametrize("transport, decodes, ends_in_link_times", [
    ("tcp", 1, (1, 2)),     # to one decode: 56 descriptors hold its 4 lanes, the second transfer waits (setup too)
    ("tcp", 2, (2, 2)),     # to two decodes: both move bytes at once, each at half the link
    ("rdma", 1, (2, 2)),    # RDMA has no lanes: both share the NICs
])
def test_overlapping_kv_transfers_wait_for_the_peers_lanes_or_share_the_link(tiny_spec, monkeypatch, transport,
                                                                            decodes, ends_in_link_times):
    config = next(c for c in tiny_spec.configurations if c.name == f"pd-{transport}")
    config = config.model_copy(update={"roles": [r.model_copy(update={"replicas": decodes}) if r.role == "decode"
                                                 else r for r in config.roles]})
    transfers, n_tokens = kv_transfers(tiny_spec, config, monkeypatch)
    hw, cost = tiny_spec.hardware, CostModel(tiny_spec.model, tiny_spec.hardware, 1)
    setup = setup_seconds(hw, transport, cost.kv_descriptors)
    move = cost.kv_bytes(n_tokens) / link_bytes_per_s(hw, transport, 1)
    assert len(transfers) == 2 and transfers[0][0] == transfers[1][0] and n_tokens >= 2000
    start = transfers[0][0]
    if ends_in_link_times == (1, 2):
        expected = [start + setup + move, start + 2 * (setup + move)]
    else:
        expected = [start + setup + 2 * move] * 2
    assert [end for _, end in transfers] == [pytest.approx(e, abs=1e-9) for e in expected]


def test_every_api_server_on_the_path_tokenizes_the_prompt_text_before_its_engine(tiny_spec, monkeypatch):
    """aggregated pays the tokenizer once, PD on the prefill and again on the decode, EPD on the encode replica too;
    image placeholders are not tokenized; each pays vLLM's 2 ms micro-batching window. At concurrency 1 nothing
    queues, so TTFT moves by exactly that."""
    fixed = next(s for s in tiny_spec.suites if s.name == "fixed")
    mm = next(s for s in tiny_spec.suites if s.name == "mm")
    suites = [fixed.model_copy(update={"concurrencies": [1]}), mm.model_copy(update={"concurrencies": [1]})]
    spec = only(tiny_spec, {"aggregated", "pd-tcp", "epd"}).model_copy(update={"suites": suites})

    def run(us_per_token: float) -> pd.DataFrame:
        hw = spec.hardware.model_copy(update={"tokenize_us_per_token": us_per_token})
        return simulate_records(spec.model_copy(update={"hardware": hw}))
    base, slow = run(0.0), run(100.0)
    monkeypatch.setattr(apiserver, "BATCH_WAIT_S", 0.0)
    no_window = run(0.0)
    key = ["config", "suite", "workload", "index"]
    m = base[base["phase"] == "measured"].set_index(key)
    extra = (slow[slow["phase"] == "measured"].set_index(key)["ttft_ms"] - m["ttft_ms"])
    for (config, suite, workload, index), ms in extra.items():
        row = m.loc[(config, suite, workload, index)]
        px = row["image_px"]
        placeholders = 0 if pd.isna(px) or not px else image_tokens(spec.model, int(px), int(px))
        servers = {"aggregated": 1, "pd-tcp": 2, "epd": 3 if placeholders else 2}[config]
        text = int(row["prompt_tokens"]) - placeholders
        assert ms == pytest.approx(servers * 100.0 * text / 1e3, abs=1e-6), (config, workload)
        window = row["ttft_ms"] - no_window.set_index(key).loc[(config, suite, workload, index), "ttft_ms"]
        assert window == pytest.approx(servers * 2.0, abs=1e-6), (config, workload)
    assert (extra > 0).all()


def test_each_token_leaves_through_the_streaming_api_servers_output_path(tiny_spec):
    """At concurrency 1 each step hands one token to the streaming replica's API server (PD: the prefill leg's one
    token too, on the prefill's): TTFT moves by the output path once per replica, every later token by it too,
    so TPOT does not move; the response ends when its last token has left."""
    fixed = next(s for s in tiny_spec.suites if s.name == "fixed")
    spec = only(tiny_spec, {"aggregated", "pd-tcp"}).model_copy(
        update={"suites": [fixed.model_copy(update={"concurrencies": [1]})]})

    def run(us: float) -> pd.DataFrame:
        hw = spec.hardware.model_copy(update={"output_us_per_token": us})
        recs = simulate_records(spec.model_copy(update={"hardware": hw}))
        return recs[recs["phase"] == "measured"].set_index(["config", "workload", "index"])
    base, slow = run(0.0), run(500.0)
    extra = slow["ttft_ms"] - base["ttft_ms"]
    for (config, _, _), ms in extra.items():
        assert ms == pytest.approx({"aggregated": 0.5, "pd-tcp": 1.0}[config], abs=1e-6), config
    decode_span = lambda r: r["e2e_ms"] - r["ttft_ms"]           # noqa: E731
    assert (decode_span(slow) - decode_span(base)).abs().max() < 1e-6
    last = slow["chunk_offsets_ns"].map(lambda o: o[-1] / 1e6)
    assert (slow["done_ms"] - last).abs().max() < 1e-6 and (base["done_ms"] < slow["done_ms"]).all()


@pytest.mark.parametrize("kv_blocks", [None, 514], ids=["kv-ample", "kv-starved"])
def test_fused_decode_steps_give_exactly_the_records_of_stepping_one_by_one(tiny_spec, monkeypatch, kv_blocks):
    """sim.fused: the virtual core runs decode-only stretches as one event, cut by every arrival and abort; the
    records (every token's stamp) are bit for bit those of planning and sleeping each step. Starved of KV blocks
    (514 blocks of 16 tokens: two 4096-token prompts and barely more), stretches also end where a decode's next
    block would not fit, and requests are preempted and recomputed."""
    from epdbench.sim import engine as engine_module
    spec = tiny_spec.model_copy(update={"engine": tiny_spec.engine.model_copy(
        update={"num_gpu_blocks_override": kv_blocks})})
    init = engine_module.Engine.__init__
    steps: dict[bool, int] = {}

    def run(fuse: bool) -> pd.DataFrame:
        engines = []

        def patched(self, *args, **kwargs):
            init(self, *args, **{**kwargs, "fuse_decodes": fuse})
            engines.append(self)
        monkeypatch.setattr(engine_module.Engine, "__init__", patched)
        recs = simulate_records(spec)
        steps[fuse] = sum(e.stats.steps for e in engines)
        if kv_blocks:
            assert sum(e.stats.preemptions for e in engines) > 0
        return recs
    stepped, fused = run(False), run(True)
    assert len(stepped) == len(fused) > 0 and steps[True] == steps[False]
    for column in stepped.columns:
        assert stepped[column].map(repr).equals(fused[column].map(repr)), column


def test_stand_in_images_give_exactly_the_records_of_drawn_ones(tiny_spec, monkeypatch):
    """The virtual-time core reads an image's size and identity only, so it is served stand-in images
    (specs.workload.stand_in_image): the records are those of the drawn images, bit for bit, but for the
    hashes — with the encoder and processor caches (one reused image) and the prefix cache in play."""
    spec = only(tiny_spec, {"aggregated", "epd"})
    calibration = prompt_calibration(spec)

    def records() -> list[dict]:
        monkeypatch.setattr(vrun, "_REQUESTS", {})
        return [r for c in spec.configurations for r in simulate_configuration(spec, c, calibration)]

    stand_in = records()
    monkeypatch.setattr(vrun, "build_requests",
                        lambda *a, **k: specs_workload.build_requests(*a, **{**k, "stand_in_images": False}))
    drawn = records()
    hashes = {"prompt_hash", "image_hash"}
    with_image = [i for i, r in enumerate(drawn) if r["image_hash"]]
    assert with_image and all(drawn[i]["image_hash"] != stand_in[i]["image_hash"] for i in with_image)
    assert [{k: v for k, v in r.items() if k not in hashes} for r in stand_in] == \
        [{k: v for k, v in r.items() if k not in hashes} for r in drawn]
