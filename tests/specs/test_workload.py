"""specs/workload.py: matched, seeded request lists; exact prompt lengths; real images of the right size."""
from __future__ import annotations

import base64
import hashlib
import io

import pytest
from PIL import Image

from epdbench.specs.models import SpecError, load_spec, parse_spec
from epdbench.specs.workload import build_requests, calibration_keys, plan_cells

PNG_PREFIX = "data:image/png;base64,"


@pytest.fixture(scope="module")
def smoke():
    return load_spec("smoke")


def spec_with(smoke, suites):
    return parse_spec({**smoke.model_dump(mode="json"), "suites": suites})


@pytest.fixture(scope="module")
def spec(smoke):
    return spec_with(smoke, [
        {"kind": "fixed", "name": "fixed", "n_warmup": 2, "n_measured": 5,
         "n_measured_by_concurrency": {8: 24}, "n_warmup_by_concurrency": {8: 8},
         "shapes": [{"input_tokens": 64, "output_tokens": 4}, {"input_tokens": 300, "output_tokens": 8}],
         "concurrencies": [1, 4, 8]},
        {"kind": "multimodal", "name": "mm", "n_warmup": 1, "n_measured": 3, "concurrencies": [2],
         "cells": [{"name": "small", "image_px": 84, "text_tokens": 20, "output_tokens": 4},
                   {"name": "1k", "image_px": 560, "text_tokens": 624, "output_tokens": 64}]},
        {"kind": "multimodal", "name": "mm-reuse", "n_warmup": 1, "n_measured": 3, "concurrencies": [2],
         "reuse_image": True, "cells": [{"name": "small", "image_px": 84, "text_tokens": 20, "output_tokens": 4}]},
    ])


def cell(spec, suite, workload_prefix, concurrency):
    return next(c for c in plan_cells(spec) if c.suite == suite and c.workload.startswith(workload_prefix)
                and c.concurrency == concurrency)


def decode_image(req) -> bytes:
    url = req.payload["messages"][0]["content"][0]["image_url"]["url"]
    assert url.startswith(PNG_PREFIX)
    return base64.b64decode(url[len(PNG_PREFIX):])


def test_plan_cells_counts_and_measured_override(spec):
    cells = plan_cells(spec)
    by_suite = {s: [c for c in cells if c.suite == s] for s in ("fixed", "mm", "mm-reuse")}
    assert len(by_suite["fixed"]) == 2 * 3 and len(by_suite["mm"]) == 2 * 1 and len(by_suite["mm-reuse"]) == 1
    assert len(cells) == 9
    assert len({c.cell_id for c in cells}) == len(cells)
    for c in by_suite["fixed"]:
        assert c.kind == "fixed" and c.n_warmup == (8 if c.concurrency == 8 else 2)
        assert sum(r.phase == "warmup" for r in build_requests(spec, c, 0)) == c.n_warmup
        assert c.n_measured == (24 if c.concurrency == 8 else 5)
    assert all(c.kind == "multimodal" and (c.n_warmup, c.n_measured) == (1, 3) for c in by_suite["mm"])


def test_plan_cells_of_smoke_preset(smoke):
    cells = plan_cells(smoke)
    grids = [s for s in smoke.suites if s.kind != "mixed"]
    streams = [st for s in smoke.suites if s.kind == "mixed" for st in s.streams]
    expected = sum(len(s.shapes if s.kind == "fixed" else s.cells) * len(s.concurrencies) for s in grids)
    assert len(cells) == expected + len(streams)
    for s in grids:
        for c in (c for c in cells if c.suite == s.name):
            assert c.n_measured == s.n_measured_by_concurrency.get(c.concurrency, s.n_measured)
    for st in streams:
        c = next(c for c in cells if c.stream == st.name)
        assert c.n_measured == st.n_requests and c.concurrency == st.concurrency and c.arrival == st.arrival


def test_burst_stream_is_seeded_and_scheduled_in_bursts():
    spec = load_spec("pd-text")
    burst = next(c for c in plan_cells(spec) if c.stream == "burst")
    reqs = build_requests(spec, burst)
    lengths = [r.target_prompt_tokens for r in reqs]
    assert all(4096 <= n <= 8192 for n in lengths) and len(set(lengths)) > 30
    assert lengths == [r.target_prompt_tokens for r in build_requests(spec, burst)]        # seeded
    assert lengths != [r.target_prompt_tokens for r in build_requests(spec, burst, seed=1)]
    assert [r.offset_s for r in reqs[:9]] == [0, 0, 0, 0, 2, 2, 2, 2, 4]
    steady = next(c for c in plan_cells(spec) if c.stream == "steady")
    assert {r.offset_s for r in build_requests(spec, steady)} == {None}          # closed loop
    assert all(len(r.payload["prompt"].split()) == r.target_prompt_tokens for r in reqs)


def test_calibration_sets_word_counts():
    from epdbench.specs.workload import Calibration
    spec = load_spec("smoke")
    c = next(c for c in plan_cells(spec) if c.workload == "512/64")
    cal = Calibration({"completions:0": (1.25, 3.0)})       # e.g. a BPE tokenizer: 1.25 tokens per word
    r = build_requests(spec, c, calibration=cal)[0]
    assert len(r.payload["prompt"].split()) == round((512 - 3) / 1.25)
    assert r.target_prompt_tokens == 512


def test_jpeg_images_have_the_right_size():
    spec = load_spec("smoke")
    data = spec.model_dump(mode="json")
    data["suites"] = [{"kind": "multimodal", "name": "mm", "image_format": "jpeg", "concurrencies": [1],
                       "n_warmup": 0, "n_measured": 1,
                       "cells": [{"name": "s", "image_px": 840, "text_tokens": 10, "output_tokens": 2}]}]
    spec = parse_spec(data)
    r = build_requests(spec, plan_cells(spec)[0])[0]
    url = r.payload["messages"][0]["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as im:
        assert im.size == (840, 840) and im.format == "JPEG"


def test_build_requests_is_a_pure_function_of_spec_cell_and_seed(spec):
    c = cell(spec, "fixed", "64/", 4)
    first = build_requests(spec, c)
    assert build_requests(spec, c) == first
    assert build_requests(spec, c, seed=spec.seed) == first
    # a later trial replays the same list but for the nonces (fresh caches), itself a pure function
    assert build_requests(spec, c, trial=3) == build_requests(spec, c, trial=3) != first
    other = build_requests(spec, c, seed=spec.seed + 1)
    assert len(other) == len(first)
    assert all(a.payload["prompt"] != b.payload["prompt"] for a, b in zip(first, other))


def test_warmup_then_measured_counts(spec):
    c = cell(spec, "fixed", "64/", 8)
    reqs = build_requests(spec, c)
    assert [r.phase for r in reqs] == ["warmup"] * 8 + ["measured"] * 24
    assert [r.index for r in reqs] == list(range(32))


@pytest.mark.parametrize("shape", ["64/4", "300/8"])
def test_fixed_prompts_have_exact_length_and_unique_nonce(spec, shape):
    c = cell(spec, "fixed", shape, 1)
    n_in, n_out = (int(x) for x in shape.split("/"))
    reqs = build_requests(spec, c)
    for r in reqs:
        assert r.api == "completions"
        assert len(r.payload["prompt"].split()) == n_in
        assert r.target_prompt_tokens == n_in
        assert r.payload["max_tokens"] == n_out == r.max_tokens
        assert r.payload["ignore_eos"] is True
    first_words = [r.payload["prompt"].split()[0] for r in reqs]
    assert len(set(first_words)) == len(reqs)


def test_nonces_differ_across_cells_of_the_same_shape(spec):
    a = build_requests(spec, cell(spec, "fixed", "64/", 1))
    b = build_requests(spec, cell(spec, "fixed", "64/", 4))
    assert not {r.payload["prompt"].split()[0] for r in a} & {r.payload["prompt"].split()[0] for r in b}


def test_multimodal_requests_carry_png_of_exact_size(spec):
    c = cell(spec, "mm", "small", 2)
    reqs = build_requests(spec, c)
    assert len(reqs) == 4
    for r in reqs:
        assert r.api == "chat" and r.image_px == 84
        data = decode_image(r)
        img = Image.open(io.BytesIO(data))
        assert img.format == "PNG" and img.size == (84, 84)
        # the recorded hash identifies the bytes actually sent
        assert r.image_hash == hashlib.sha256(data).hexdigest()[:16]
        text = r.payload["messages"][0]["content"][1]["text"]
        assert len(text.split()) == 20


def test_unique_images_without_reuse(spec):
    reqs = build_requests(spec, cell(spec, "mm", "small", 2))
    assert len({r.image_hash for r in reqs}) == len(reqs)
    assert len({decode_image(r) for r in reqs}) == len(reqs)


def test_one_image_with_reuse(spec):
    reqs = build_requests(spec, cell(spec, "mm-reuse", "small", 2))
    assert len(reqs) == 4
    assert len({r.image_hash for r in reqs}) == 1
    assert len({decode_image(r) for r in reqs}) == 1
    # still one unique question per request
    assert len({r.prompt_hash for r in reqs}) == len(reqs)


def test_no_image_is_sent_in_two_cells_of_the_published_preset():
    # An image placed before the nonced text is a shared prefix: reusing it across cells (say, c=1's images
    # again at c=4) would hand later cells prefix- and encoder-cache hits the suite never asked for.
    spec = load_spec("epd-multimodal")
    seen: dict[str, str] = {}
    reused = expected = 0
    for c in plan_cells(spec):
        expected += 1 if c.suite == "mm-reuse" else c.n_warmup + c.n_measured
        hashes = {r.image_hash for r in build_requests(spec, c, stand_in_images=True)}   # drawn: from the same seeds
        if c.suite == "mm-reuse":
            assert len(hashes) == 1
            reused += 1
        for h in hashes:
            assert h not in seen, f"image {h} of {c.cell_id} was already sent in {seen[h]}"
            seen[h] = c.cell_id
    assert reused == 2 and len(seen) == expected


def test_images_are_seeded(spec):
    c = cell(spec, "mm", "small", 2)
    assert [decode_image(r) for r in build_requests(spec, c)] == [decode_image(r) for r in build_requests(spec, c)]
    assert decode_image(build_requests(spec, c, seed=7)[0]) != decode_image(build_requests(spec, c)[0])


def test_target_prompt_tokens_of_560px_image_on_smoke_model(spec):
    reqs = build_requests(spec, cell(spec, "mm", "1k", 2))
    # 624 text + 23 chat template + 400 image tokens (560² px / 28² px), WORKLOADS.md: measured 1,047–1,050
    assert {r.target_prompt_tokens for r in reqs} == {624 + 23 + 400} == {1047}
    assert Image.open(io.BytesIO(decode_image(reqs[0]))).size == (560, 560)


def test_each_trial_has_fresh_nonces_and_images_but_the_same_shapes():
    spec = load_spec("smoke")
    fixed = next(c for c in plan_cells(spec) if c.workload == "512/64")
    t0, t1 = build_requests(spec, fixed, trial=0), build_requests(spec, fixed, trial=1)
    assert [r.payload["prompt"].split()[1:] for r in t0] == [r.payload["prompt"].split()[1:] for r in t1]
    assert all(a.payload["prompt"].split()[0] != b.payload["prompt"].split()[0] for a, b in zip(t0, t1))
    mm = next(c for c in plan_cells(spec) if c.kind == "multimodal")
    assert {r.image_hash for r in build_requests(spec, mm, trial=0)}.isdisjoint(
        {r.image_hash for r in build_requests(spec, mm, trial=1)})


def rate_spec(arrival="poisson", rates=(2.0, 8.0), n=400):
    data = load_spec("smoke").model_dump(mode="json")
    data["suites"] = [{"kind": "rate", "name": "cap", "shapes": [{"input_tokens": 256, "output_tokens": 16}],
                       "rates": list(rates), "arrival": arrival, "n_measured": n, "n_warmup": 1}]
    return parse_spec(data, "rate")


def test_rate_cells_offer_seeded_open_loop_arrivals_at_their_rate():
    from epdbench.specs.workload import arrival_offsets
    spec = rate_spec()
    cells = plan_cells(spec)
    assert [(c.workload, c.rate, c.concurrency) for c in cells] == [("256/16@2/s", 2.0, 1024), ("256/16@8/s", 8.0, 1024)]
    reqs = build_requests(spec, cells[1])
    assert reqs[0].phase == "warmup" and reqs[0].offset_s is None            # warm-up: closed loop
    offsets = [r.offset_s for r in reqs[1:]]
    assert offsets == sorted(offsets) and offsets[0] == 0.0
    assert 0.8 < (len(offsets) - 1) / offsets[-1] / 8.0 < 1.2               # the Poisson process runs at 8 req/s
    assert offsets == [r.offset_s for r in build_requests(spec, cells[1])[1:]]       # seeded: the same every time
    assert offsets != arrival_offsets(cells[1], spec.seed, trial=1)          # another trial, other arrivals
    constant = build_requests(rate_spec("constant"), plan_cells(rate_spec("constant"))[0])
    assert [r.offset_s for r in constant[1:4]] == [0.0, 0.5, 1.0]


def test_a_closed_loop_first_wave_is_spread_seeded_and_the_rest_follow_as_workers_free():
    spec = load_spec("smoke")
    cell = next(c for c in plan_cells(spec) if c.concurrency == 8 and c.suite == "fixed")
    assert cell.first_wave_spread_s == 0.1
    measured = [r for r in build_requests(spec, cell) if r.phase == "measured"]
    first = [r.offset_s for r in measured[:8]]
    assert all(0 <= x < 0.1 for x in first) and first == sorted(first) and len(set(first)) == 8
    assert all(r.offset_s is None for r in measured[8:])
    data = spec.model_dump(mode="json")
    data["suites"][0]["first_wave_spread_s"] = 0
    flat = parse_spec(data, "t")
    cell = next(c for c in plan_cells(flat) if c.concurrency == 8 and c.suite == "fixed")
    assert all(r.offset_s is None for r in build_requests(flat, cell))


@pytest.mark.parametrize("rates", [[4, 2], [0], [1, 1]])
def test_rates_must_be_positive_increasing_and_distinct(rates):
    with pytest.raises(Exception, match="rates"):
        rate_spec(rates=rates)


def test_each_suite_says_how_it_offers_its_load():
    smoke = {s.name: s.load_text() for s in load_spec("smoke").suites}
    assert smoke["fixed"].startswith("closed loop") and "within 0.1 s" in smoke["fixed"]
    assert "burst: bursts of 2 every 1 s, at most 2 in flight" in smoke["mixed"]
    assert rate_spec().suites[0].load_text().startswith("open loop: Poisson arrivals (seeded) at 2, 8 req/s, "
                                                        "at most 1024 in flight")


def test_a_rate_or_fixed_shape_with_an_image_sends_a_fresh_image_of_its_size_per_request(smoke):
    spec = spec_with(smoke, [
        {"kind": "rate", "name": "cap", "rates": [1.0, 2.0], "n_measured": 3, "n_warmup": 1,
         "shapes": [{"image_px": 84, "input_tokens": 40, "output_tokens": 8}, {"input_tokens": 64, "output_tokens": 8}],
         "slo": {"ttft_ms": 2000}},
        {"kind": "fixed", "name": "fixed", "n_warmup": 0, "n_measured": 2, "concurrencies": [1],
         "shapes": [{"image_px": 84, "input_tokens": 40, "output_tokens": 8}]}])
    cells = plan_cells(spec)
    assert [c.workload for c in cells] == ["84px+40/8@1/s", "84px+40/8@2/s", "64/8@1/s", "64/8@2/s", "84px+40/8"]
    image_cells = [c for c in cells if c.workload.startswith("84px")]
    hashes = []
    for c in image_cells:
        for r in build_requests(spec, c):
            assert r.api == "chat" and r.image_px == 84 and r.offset_s == (None if r.phase == "warmup" else r.offset_s)
            assert Image.open(io.BytesIO(decode_image(r))).size == (84, 84)
            assert len(r.payload["messages"][0]["content"][1]["text"].split()) == 40
            hashes.append(r.image_hash)
    assert len(set(hashes)) == len(hashes) == 4 + 4 + 2                # no image sent twice, across rates too
    assert build_requests(spec, cells[2])[0].api == "completions"      # a shape without image_px: text only


def test_a_shape_with_an_image_needs_a_vision_model(smoke):
    data = smoke.model_dump(mode="json")
    data["model"]["vision"] = None
    data["suites"] = [{"kind": "rate", "name": "cap", "rates": [1.0],
                       "shapes": [{"image_px": 84, "input_tokens": 40, "output_tokens": 8}]}]
    with pytest.raises(SpecError, match="sends images but 'model.vision' is not set"):
        parse_spec(data)


@pytest.mark.parametrize("preset", ["smoke", "pd-text", "epd-multimodal", "epd-reuse"])
def test_calibration_keys_are_those_of_the_requests_without_building_them(preset):
    spec = load_spec(preset)
    built = {(r.api, r.image_px) for c in plan_cells(spec) for r in build_requests(spec, c, stand_in_images=True)}
    assert calibration_keys(spec) == built


def test_stand_in_images_are_valid_pngs_of_the_size_unique_per_image_with_the_same_texts(spec):
    c = cell(spec, "mm", "1k", 2)
    drawn, stand_in = build_requests(spec, c), build_requests(spec, c, stand_in_images=True)
    assert [r.payload["messages"][0]["content"][1]["text"] for r in drawn] == \
        [r.payload["messages"][0]["content"][1]["text"] for r in stand_in]
    images = [decode_image(r) for r in stand_in]
    for r, data in zip(stand_in, images):
        img = Image.open(io.BytesIO(data))
        img.load()                                                    # decodes: a whole PNG, not a header
        assert img.format == "PNG" and img.size == (560, 560) and r.image_px == 560
        assert r.image_hash == hashlib.sha256(data).hexdigest()[:16]
    assert len(set(images)) == len(images)
    assert images == [decode_image(r) for r in build_requests(spec, c, stand_in_images=True)]   # seeded
    reuse = build_requests(spec, cell(spec, "mm-reuse", "small", 2), stand_in_images=True)
    assert len({r.image_hash for r in reuse}) == 1
