"""The ground-truth rows: engine means from /metrics deltas, vllm bench serve's result file, its command line."""
import json

import pytest

from epdbench.analysis.truth_rows import (TRUTH_COLUMNS, bench_seed, bench_serve_args, client_figures_from_bench,
                                         engine_means, truth_row)


def metrics(prefill_sum: float, prefill_count: int, with_queue: bool = True) -> str:
    """vLLM 0.26's exposition of two of its request histograms, one engine, two label sets summed."""
    lines = ["# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.",
             "# TYPE vllm:request_prefill_time_seconds histogram",
             f'vllm:request_prefill_time_seconds_sum{{engine="0",model_name="m"}} {prefill_sum / 2}',
             f'vllm:request_prefill_time_seconds_count{{engine="0",model_name="m"}} {prefill_count / 2}',
             f'vllm:request_prefill_time_seconds_sum{{engine="1",model_name="m"}} {prefill_sum / 2}',
             f'vllm:request_prefill_time_seconds_count{{engine="1",model_name="m"}} {prefill_count / 2}',
             f'vllm:request_prefill_time_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {prefill_count / 2}']
    if with_queue:
        lines += ['vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.5',
                  'vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 10']
    return "\n".join(lines) + "\n"


def test_engine_means_are_window_deltas_in_ms():
    out = engine_means(metrics(1.0, 10), metrics(1.8, 14))
    assert out["engine_prefill_ms_mean"] == pytest.approx(200.0)        # 0.8 s over 4 requests
    assert out["engine_queue_ms_mean"] is None                          # no request ended in the window
    assert out["engine_decode_ms_mean"] is None                         # not exposed at all


def test_engine_means_from_nothing_before_and_missing_histograms():
    assert engine_means("", metrics(0.3, 2))["engine_prefill_ms_mean"] == pytest.approx(150.0)
    assert set(engine_means("", "")) == {c for c in TRUTH_COLUMNS if c.startswith("engine_")}   # cache hits too
    assert all(v is None for v in engine_means("", "").values())


def test_bench_result_maps_to_the_product_columns():
    result = {"num_prompts": 8, "completed": 8, "total_input_tokens": 8 * 1047, "median_ttft_ms": 41.5,
              "p99_ttft_ms": 60.25, "median_tpot_ms": 6.5, "p99_itl_ms": 7.75, "output_throughput": 150.0,
              "request_throughput": 1.2}
    got = client_figures_from_bench(result)
    assert got == {"n_measured": 8, "requests_ok": 8, "prompt_tokens_mean": 1047.0, "ttft_p50_ms": 41.5,
                   "ttft_p99_ms": 60.25, "tpot_p50_ms": 6.5, "itl_p99_ms": 7.75, "output_tok_s": 150.0,
                   "req_s": 1.2}
    assert client_figures_from_bench({"num_prompts": 4, "completed": 0})["prompt_tokens_mean"] is None


def test_bench_args_text_and_image():
    common = dict(output_tokens=128, concurrency=8, n_measured=16, base_url="http://127.0.0.1:1",
                  model="m", tokenizer="/tok", seed=0, result_dir="/r", result_file="f.json")
    text = bench_serve_args(api="completions", input_tokens=4096, image_px=None, **common)
    assert text[:2] == ["--dataset-name", "random"]
    assert text[text.index("--endpoint") + 1] == "/v1/completions"
    assert text[text.index("--random-input-len") + 1] == "4096"
    assert "--ignore-eos" in text and text[text.index("--max-concurrency") + 1] == "8"
    image = bench_serve_args(api="chat", input_tokens=400, image_px=1260, **common)
    assert image[:2] == ["--dataset-name", "random-mm"]
    assert image[image.index("--backend") + 1] == "openai-chat"
    assert image[image.index("--random-mm-bucket-config") + 1] == "{(1260, 1260, 1): 1.0}"
    assert image[image.index("--random-mm-base-items-per-request") + 1] == "1"
    for args in (text, image):
        # its own warm-ups would repeat its first measured prompt; greedy decoding is not what the product asks for
        assert args[args.index("--num-warmups") + 1] == "0" and "--temperature" not in args


def test_bench_sends_a_reuse_cells_own_messages_through_its_custom_image_dataset():
    """One image sent again with a new question each request, which vllm bench serve's random datasets cannot make:
    the product's own messages, image first, as the custom_image dataset's `content` lines."""
    from epdbench.analysis.truth_rows import bench_dataset_lines
    from epdbench.specs.models import load_spec
    from epdbench.specs.workload import build_requests, plan_cells
    spec = load_spec("vllm-truth")
    cell = next(c for c in plan_cells(spec) if c.suite == "mm-reuse")
    payloads = [r.payload for r in build_requests(spec, cell, 1) if r.phase == "measured"]
    lines = bench_dataset_lines(payloads)
    parsed = [json.loads(x)["content"] for x in lines]
    assert len(parsed) == cell.n_measured and all([p["type"] for p in c] == ["image_url", "text"] for c in parsed)
    assert len({c[0]["image_url"]["url"] for c in parsed}) == 1           # the one image, in every request
    assert len({c[1]["text"] for c in parsed}) == cell.n_measured           # each with its own question
    args = bench_serve_args(api="chat", input_tokens=400, output_tokens=128, image_px=1792, concurrency=4,
                            n_measured=12, base_url="http://127.0.0.1:1", model="m", tokenizer="/tok", seed=3,
                            result_dir="/r", result_file="f.json", dataset="/r/reuse.jsonl")
    assert args[:5] == ["--dataset-name", "custom_image", "--dataset-path", "/r/reuse.jsonl",
                        "--enable-multimodal-chat"]
    assert args[args.index("--custom-output-len") + 1] == "128" and "--ignore-eos" in args
    assert not any(a.startswith("--random") for a in args)
    with pytest.raises(ValueError, match="one user message"):
        bench_dataset_lines([{"prompt": "text only"}])


def test_bench_seeds_differ_per_cell_and_repeat_per_spec_seed():
    cells = [f"text|{n}/128|c{c}|main" for n in (1024, 4096, 8192) for c in (1, 8, 32)]
    seeds = [bench_seed(0, c) for c in cells]
    assert len(set(seeds)) == len(cells) and all(0 <= s < 2**31 for s in seeds)
    assert seeds == [bench_seed(0, c) for c in cells] and bench_seed(1, cells[0]) != seeds[0]


def cache_metrics(hits: float, queries: float, mm_hits: float | None = None, mm_queries: float | None = None) -> str:
    """vLLM 0.26's cache counters (vllm/v1/metrics/loggers.py), as its /metrics exposes them."""
    lines = ["# TYPE vllm:prefix_cache_queries_total counter",
             f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}',
             f'vllm:prefix_cache_queries_created{{engine="0",model_name="m"}} 1.7e9',
             "# TYPE vllm:prefix_cache_hits_total counter",
             f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}']
    if mm_hits is not None:
        lines += [f'vllm:mm_cache_queries_total{{engine="0",model_name="m"}} {mm_queries}',
                  f'vllm:mm_cache_hits_total{{engine="0",model_name="m"}} {mm_hits}']
    return "\n".join(lines) + "\n"


def test_cache_hits_are_the_window_share_of_what_was_looked_up():
    out = engine_means(cache_metrics(100, 1000, 0, 10), cache_metrics(400, 2000, 2, 20))
    assert out["engine_prefix_hit_pct"] == pytest.approx(30.0)       # 300 of 1000 tokens looked up in the window
    assert out["engine_mm_hit_pct"] == pytest.approx(20.0)           # 2 of 10 images
    cold = engine_means(cache_metrics(0, 1000), cache_metrics(0, 5000))
    assert cold["engine_prefix_hit_pct"] == 0.0 and cold["engine_mm_hit_pct"] is None   # no encoder cache exposed
    idle = engine_means(cache_metrics(5, 100), cache_metrics(5, 100))
    assert idle["engine_prefix_hit_pct"] is None                      # nothing looked up in the window


def test_truth_row_orders_columns_rounds_and_keeps_nulls():
    row = truth_row({"tool": "epdbench", "concurrency": 1}, {"ttft_p50_ms": 12.345678}, {"engine_prefill_ms_mean": None})
    assert list(row) == TRUTH_COLUMNS
    assert row["ttft_p50_ms"] == 12.346 and row["engine_prefill_ms_mean"] is None and row["gpu"] is None



def test_window_means_and_caches_from_a_runs_per_role_deltas():
    """A PD window: queue and prefill from the prefill engine, decode figures from the decode engine, the prefix
    cache of the prefill engine; EPD's images counted where encode took them in."""
    from epdbench.analysis.prom import counter_deltas
    from epdbench.analysis.truth_rows import engine_means_of_deltas
    prefill = counter_deltas(metrics(1.0, 10) + cache_metrics(0, 0),
                             metrics(1.8, 14) + cache_metrics(300, 1000, 0, 4))
    decode = counter_deltas("", 'vllm:request_decode_time_seconds_sum{engine="0"} 2.0\n'
                                'vllm:request_decode_time_seconds_count{engine="0"} 4\n')
    out = engine_means_of_deltas({"prefill": prefill, "decode": decode})
    assert out["engine_prefill_ms_mean"] == pytest.approx(200.0) and out["engine_decode_ms_mean"] == pytest.approx(500.0)
    assert out["engine_queue_ms_mean"] is None and out["engine_tpot_ms_mean"] is None
    assert out["engine_prefix_hit_pct"] == pytest.approx(30.0) and out["engine_mm_hit_pct"] == 0.0
    encode = counter_deltas(cache_metrics(0, 0), cache_metrics(0, 0, 3, 4))
    assert engine_means_of_deltas({"encode": encode, "prefill": prefill})["engine_mm_hit_pct"] == pytest.approx(75.0)
    assert all(v is None for v in engine_means_of_deltas({}).values())


def test_run_rows_one_per_config_cell_and_stream_of_trial_zero():
    from epdbench.analysis import truth
    from epdbench.analysis.prom import counter_deltas
    from epdbench.analysis.truth_rows import run_rows
    base = {"requests_ok": 12, "requests_total": 12, "ttft_p50_ms": 90.0, "tpot_p50_ms": 7.0, "itl_p99_ms": 40.0,
            "prompt_tokens_mean": 4521.0, "trial": 0}
    summary = [{**base, "config": "aggregated", "suite": "text-with-images", "workload": "1024/256",
                "concurrency": 4, "stream": "text"},
               {**base, "config": "aggregated", "suite": "text-with-images", "workload": "1792px+400/64",
                "concurrency": 2, "stream": "images"},
               {**base, "config": "aggregated", "suite": "mm-reuse", "workload": "reuse:1792px+400/64",
                "concurrency": 4, "stream": "main"},
               {**base, "config": "aggregated", "suite": "mm-reuse", "workload": "reuse:1792px+400/64",
                "concurrency": 4, "stream": "main", "trial": 1},
               {**base, "config": "aggregated", "suite": "capacity", "workload": "1024/128@4/s", "concurrency": 64}]
    window = {"server": counter_deltas(metrics(0.0, 0), metrics(1.2, 6))}
    reuse = {"server": counter_deltas(cache_metrics(0, 0, 0, 0), cache_metrics(3000, 4000, 10, 14))}
    rows = run_rows(summary, {"aggregated": {"text-with-images": {"metrics_delta": window},
                                             "mm-reuse": {"metrics_delta": reuse}}},
                    gpu="NVIDIA H100 80GB HBM3", vllm_version="0.26.0", model="Qwen/Qwen2.5-VL-7B-Instruct")
    assert [(r["suite"], r["stream"]) for r in rows] == [("text-with-images", "text"),
                                                       ("text-with-images", "images"), ("mm-reuse", "main")]
    text, images, reused = rows
    assert (text["input_tokens"], text["image_px"], text["output_tokens"]) == (1024, 0, 256)
    assert (reused["input_tokens"], reused["image_px"], reused["output_tokens"]) == (400, 1792, 64)
    assert text["engine_prefill_ms_mean"] == images["engine_prefill_ms_mean"] == pytest.approx(200.0)
    assert reused["engine_prefix_hit_pct"] == pytest.approx(75.0) and reused["engine_mm_hit_pct"] == pytest.approx(71.429)
    frame = __import__("pandas").DataFrame(rows, columns=TRUTH_COLUMNS)
    truth.check(frame)                                     # a valid table: the cell-named workload parses
    notes = []
    assert truth.usable(frame, notes).index.tolist() == [0, 1]          # the reuse row is warm
    assert ("aggregated", "text-with-images", "1024/256", 4, "text") in truth.cells(frame).index
