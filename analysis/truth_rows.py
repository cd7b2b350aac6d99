"""Ground truth of real vLLM cells (pure): the rows of `benchmarks/data/vllm_truth_<gpu>.csv`, one per tool × cell,
from the product's load generator's records or from `vllm bench serve`'s result file, each with the engine's own
step timings over the cell read from its /metrics histograms (after − before, sum ÷ count).

The benchmark that measures them is `benchmarks/simulator/vllm_truth.py`; what reads them is
`benchmarks/simulator/sim_vs_real.py` and `epdbench calibrate --engine-steps`, through analysis/truth.py (the table's
contract and checks).
"""
from __future__ import annotations

import hashlib
import json
import math

from epdbench.analysis.prom import counter_deltas, hit_rate
from epdbench.analysis.truth import COLUMNS, TELEMETRY, parse_workload

# vLLM's cache counters (analysis.prom.DELTA_COUNTERS' keys): the share of the cell's prompt tokens its prefix cache
# served, and of its images its multi-modal processor cache did. A truth row is meant to be cold;
# analysis.truth.usable leaves out a warm one.
ENGINE_CACHES = {"engine_prefix_hit_pct": ("prefix_cache_hits", "prefix_cache_queries"),
                 "engine_mm_hit_pct": ("mm_cache_hits", "mm_cache_queries")}
TRUTH_COLUMNS = COLUMNS


def engine_means(before: str, after: str) -> dict[str, float | None]:
    """Mean engine time (ms) per request of each of vLLM's own request histograms (analysis.prom.DELTA_COUNTERS'
    engine_*_s sums and counts: the engine core's view of each request, free of the client, the HTTP server and the
    network) over the window between one engine's two /metrics texts, and the window's cache hits in % of what was
    looked up (ENGINE_CACHES); None where the metric is missing or nothing ended or was looked up in the window
    (never 0)."""
    return engine_means_of_deltas({"server": counter_deltas(before, after)})


def _num(value) -> float | None:
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def client_figures_from_summary(stats: dict) -> dict:
    """The client columns from epdbench's own cell summary (analysis.metrics.summarize_cell, or a run's summary
    row), and the GPU over the cell (analysis.truth.TELEMETRY) where the summary has it."""
    return {"n_measured": stats.get("requests_total"), "requests_ok": stats.get("requests_ok"),
            "prompt_tokens_mean": _num(stats.get("prompt_tokens_mean")),
            **{k: _num(stats.get(k)) for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms",
                                               "output_tok_s", "req_s", *TELEMETRY)}}


def client_figures_from_bench(result: dict) -> dict:
    """The client columns from `vllm bench serve --save-result`'s JSON (vllm/benchmarks/serve.py: median_* and
    p99_* per metric with --metric-percentiles 50,99, output_throughput, request_throughput)."""
    done = result.get("completed")
    total_in = _num(result.get("total_input_tokens"))
    return {"n_measured": result.get("num_prompts"), "requests_ok": done,
            "prompt_tokens_mean": round(total_in / done, 1) if total_in is not None and done else None,
            "ttft_p50_ms": _num(result.get("median_ttft_ms")), "ttft_p99_ms": _num(result.get("p99_ttft_ms")),
            "tpot_p50_ms": _num(result.get("median_tpot_ms")), "itl_p99_ms": _num(result.get("p99_itl_ms")),
            "output_tok_s": _num(result.get("output_throughput")), "req_s": _num(result.get("request_throughput"))}


def bench_seed(seed: int, cell_id: str) -> int:
    """`vllm bench serve`'s --seed for one cell: the spec's seed and the cell together. Its random dataset draws
    each prompt's token offsets from the seed alone, so one seed for every cell repeats the same prompts from cell to
    cell (a longer shape's prompt starting with the shorter one's): the engine's prefix cache then serves them, as a
    table measured so showed (hits up to 72 %, benchmarks/data/README.md)."""
    digest = hashlib.sha256(f"{seed}|{cell_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def bench_serve_args(*, api: str, input_tokens: int, output_tokens: int, image_px: int | None, concurrency: int,
                     n_measured: int, base_url: str, model: str, tokenizer: str, seed: int,
                     result_dir: str, result_file: str, dataset: str | None = None) -> list[str]:
    """Arguments after `vllm bench serve` for one cell on the same server: the same endpoint kind as the product's
    load generator (`api`: chat or completions), the same input and output lengths (random tokens; images of the
    cell's edge through the random-mm dataset, one per request, chat only), EOS ignored as the product does,
    closed loop at the cell's concurrency, the server's own sampling defaults as the product's requests get them
    (no --temperature: `--temperature 0` would make the bench's decode greedy where the product's samples).
    No warm-ups of its own (--num-warmups 0): vllm bench sends its first measured prompt as every warm-up, which
    leaves that prompt in the prefix cache; the caller warms the server with other prompts. `seed`: bench_seed.
    `dataset`: a JSONL of chat messages (bench_dataset_lines) sent as they are (its custom_image dataset with
    --enable-multimodal-chat, vllm/benchmarks/datasets/datasets.py CustomImageDataset), in place of random ones: a
    cell the random datasets cannot make, such as one image sent again with a new question each request."""
    chat = api == "chat" or image_px or dataset
    args = ["--backend", "openai-chat" if chat else "openai", "--base-url", base_url,
            "--endpoint", "/v1/chat/completions" if chat else "/v1/completions",
            "--model", model, "--tokenizer", tokenizer, "--seed", str(seed),
            "--num-prompts", str(n_measured), "--max-concurrency", str(concurrency), "--num-warmups", "0",
            "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", result_dir, "--result-filename", result_file, "--disable-tqdm"]
    if dataset:
        return ["--dataset-name", "custom_image", "--dataset-path", dataset, "--enable-multimodal-chat",
                "--custom-output-len", str(output_tokens), *args]
    args += ["--random-input-len", str(input_tokens), "--random-output-len", str(output_tokens),
             "--random-range-ratio", "0.0"]
    if image_px:
        return ["--dataset-name", "random-mm", *args, "--random-mm-base-items-per-request", "1",
                "--random-mm-num-mm-items-range-ratio", "0", "--random-mm-limit-mm-per-prompt",
                json.dumps({"image": 1, "video": 0}),
                "--random-mm-bucket-config", f"{{({image_px}, {image_px}, 1): 1.0}}"]
    return ["--dataset-name", "random", *args]


def bench_dataset_lines(payloads: list[dict]) -> list[str]:
    """The JSONL lines of `vllm bench serve`'s custom_image dataset for chat requests' payloads (each `messages`
    of one user turn, as the product's load generator sends them): every line one request's content parts in their
    order, the image as its data URL (vllm/benchmarks/datasets/datasets.py CustomImageDataset, `content` items)."""
    lines = []
    for p in payloads:
        messages = p.get("messages") or []
        if len(messages) != 1 or not isinstance(messages[0].get("content"), list):
            raise ValueError("a custom_image line takes one user message of content parts")
        lines.append(json.dumps({"content": messages[0]["content"]}, separators=(",", ":")))
    return lines


def truth_row(keys: dict, client: dict, engine: dict) -> dict:
    """One CSV row in TRUTH_COLUMNS order; a key missing from all three is null."""
    merged = {**keys, **client, **engine}
    return {c: round(v, 3) if isinstance(v, float) else v for c in TRUTH_COLUMNS for v in [merged.get(c)]}



# The roles whose engine a request is queued and prefilled on, and whose engine decodes and streams it (the engine
# core's histograms of each), as a run's evidence names them (specs.topology roles: server is aggregated's).
PREFILL_SIDE = ("server", "prefill")
DECODE_SIDE = ("server", "decode")
_MEAN_FROM = {"engine_queue_ms_mean": ("engine_queue_s", PREFILL_SIDE),
              "engine_prefill_ms_mean": ("engine_prefill_s", PREFILL_SIDE),
              "engine_decode_ms_mean": ("engine_decode_s", DECODE_SIDE),
              "engine_ttft_ms_mean": ("engine_ttft_s", DECODE_SIDE),
              "engine_tpot_ms_mean": ("engine_tpot_s", DECODE_SIDE)}


def engine_means_of_deltas(deltas: dict[str, dict[str, float]]) -> dict[str, float | None]:
    """A window's engine means (ms per request, engine_means' figures) and cache hits (%) from a run's per-role
    counter deltas (tasks.evidence: role -> analysis.prom.DELTA_COUNTERS' keys over one suite). Queue and prefill
    from the engine that prefilled (aggregated's server or PD's prefill), the rest from the one that decoded; the
    prefix cache of the prefilling engine; the multi-modal cache of the engine that took the images in (EPD's
    encode, else the prefilling one). None where a figure is missing or nothing ended or was looked up."""
    out: dict[str, float | None] = {}
    for column, (key, roles) in _MEAN_FROM.items():
        got = next((deltas[r] for r in roles if r in deltas), {})
        total, count = got.get(f"{key}_sum"), got.get(f"{key}_count")
        out[column] = round(total / count * 1e3, 4) if total is not None and count is not None and count > 0 else None
    prefill = next((deltas[r] for r in PREFILL_SIDE if r in deltas), {})
    images = deltas.get("encode") or prefill
    for column, source in (("engine_prefix_hit_pct", prefill), ("engine_mm_hit_pct", images)):
        hits, queries = ENGINE_CACHES[column]
        looked_up = source.get(queries)
        rate = hit_rate(source[hits], looked_up) if hits in source and looked_up and looked_up > 0 else None
        out[column] = None if rate is None else round(rate * 100, 3)
    return out


def run_rows(summary: list[dict], suites: dict[str, dict[str, dict]], *, gpu: str, vllm_version: str,
             model: str) -> list[dict]:
    """Truth rows (tool `epdbench`) of a compare run on real engines: one per configuration × cell × stream of its
    summary (trial 0 only: a truth row is one measurement), the engine figures of the cell's suite window from its
    evidence (`suites`: config -> suite -> that suite's stages evidence, with `metrics_delta`). A cell whose
    workload is no fixed shape (a rate sweep's, a stream of ranged lengths) is left out."""
    rows = []
    for r in summary:
        if int(r.get("trial", 0) or 0) != 0:
            continue
        stream = str(r.get("stream") or "main")
        shape = parse_workload(r["workload"])
        if shape is None:
            continue
        px, tokens, out = shape
        deltas = (suites.get(r["config"], {}).get(r["suite"]) or {}).get("metrics_delta") or {}
        keys = {"gpu": gpu, "vllm_version": vllm_version, "model": model, "tool": "epdbench", "config": r["config"],
                "suite": r["suite"], "workload": r["workload"], "stream": stream, "input_tokens": tokens,
                "image_px": px, "output_tokens": out, "concurrency": int(r["concurrency"])}
        rows.append(truth_row(keys, client_figures_from_summary(r), engine_means_of_deltas(deltas)))
    return rows
