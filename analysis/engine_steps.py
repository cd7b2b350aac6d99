"""An engine's own step timings per cell, as vLLM reports them on /metrics (pure: no I/O).

vLLM times each request's phases on its engine core (vllm/v1/metrics/stats.py `update_from_finished_request`) and
exports them as histograms: `vllm:request_queue_time_seconds` (queued → first scheduled),
`vllm:request_prefill_time_seconds` (first scheduled → first token), `vllm:request_decode_time_seconds` (first
token → last), `vllm:time_to_first_token_seconds` (the API server's arrival → first token) and
`vllm:request_time_per_output_token_seconds` (decode time / (tokens − 1)). A cell's mean of each is the delta of
the histogram's sum over the delta of its count: the `engine_*_ms_mean` columns of a truth table
(analysis.truth).

The simulator's engines report the same phases on their `llm_request` spans (sim.spans, the same attribute names
as vLLM's traces), so here they are averaged per cell into the same columns (engine_means); and for a lone request
— a closed loop at concurrency 1 — the cost model gives them without serving anything (lone_engine_cells,
physics.lone). Both feed the comparison of engine figures: what `calibrate --engine-steps` fits.
"""
from __future__ import annotations

import math

import pandas as pd

from epdbench.analysis.metrics import CELL_KEYS
from epdbench.otlp import ROLE_ATTR
from epdbench.physics.costmodel import (TOKENIZER_BATCH_WAIT_S, CostModel, image_preprocess_seconds, image_tokens,
                                        output_seconds, tokenize_seconds)
from epdbench.physics.lone import lone_request
from epdbench.specs.models import ExperimentSpec

ENGINE_MEANS = ("engine_queue_ms_mean", "engine_prefill_ms_mean", "engine_decode_ms_mean", "engine_ttft_ms_mean",
                "engine_tpot_ms_mean")
# The figures an engine-step fit compares: prefill time, decode time per output token after the first, and the API
# server's time between a request's arrival and its engine core queueing it (engine_preprocess_ms: the prompt's
# rendering, tokenization and multimodal processing — vLLM takes `arrival_time` as rendering starts,
# vllm/renderers/base.py `render_cmpl`, so its TTFT histogram holds it: TTFT − queue − prefill).
ENGINE_FIT_METRICS = ("engine_prefill_ms", "engine_decode_ms_per_token", "engine_preprocess_ms")
MATCH_KEYS = ["config", "suite", "workload", "concurrency", "stream"]    # analysis.fit's
PREFILL_ROLES = ("aggregated", "prefill")      # the engine a request is queued and prefilled on
DECODE_ROLES = ("aggregated", "decode")        # the engine that decodes and streams it
QUEUE, PREFILL, DECODE, TTFT = ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_model_prefill",
                                "gen_ai.latency.time_in_model_decode", "gen_ai.latency.time_to_first_token")
TOKENS = "gen_ai.usage.completion_tokens"


def _ms(value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v * 1e3 if math.isfinite(v) and v >= 0 else math.nan


def engine_means(spans: list[dict], records: pd.DataFrame) -> pd.DataFrame:
    """Per cell (CELL_KEYS) the mean of each engine phase over its measured, successful traced requests (a span
    joined to its record by trace id), in ms as ENGINE_MEANS, and `engine_requests`: how many. Queue and prefill
    from the engine that prefilled the request, decode, TTFT and time per output token from the one that streamed
    it (one engine on aggregated: both)."""
    ok = records[(records["phase"] == "measured") & records["ok"].astype(bool)]
    cell_of = {r["trace"][0]: tuple(r[k] for k in CELL_KEYS) for r in ok.to_dict("records")
               if isinstance(r.get("trace"), (list, tuple)) and r["trace"]}
    per_request: dict[str, dict] = {}
    for s in spans:
        role = (s.get("resource") or {}).get(ROLE_ATTR)
        if s.get("name") != "llm_request" or s["trace_id"] not in cell_of:
            continue
        a, figures = s.get("attributes") or {}, per_request.setdefault(s["trace_id"], {})
        if role in PREFILL_ROLES:
            figures.update(engine_queue_ms_mean=_ms(a.get(QUEUE)), engine_prefill_ms_mean=_ms(a.get(PREFILL)))
        if role in DECODE_ROLES:
            decode, tokens = _ms(a.get(DECODE)), a.get(TOKENS)
            figures.update(engine_decode_ms_mean=decode, engine_ttft_ms_mean=_ms(a.get(TTFT)),
                           engine_tpot_ms_mean=decode / (tokens - 1) if tokens and tokens > 1 else math.nan)
    rows = [{**dict(zip(CELL_KEYS, cell_of[t])), **{m: f.get(m, math.nan) for m in ENGINE_MEANS}}
            for t, f in per_request.items()]
    if not rows:
        return pd.DataFrame(columns=[*CELL_KEYS, *ENGINE_MEANS, "engine_requests"])
    frame = pd.DataFrame(rows)
    grouped = frame.groupby(CELL_KEYS, sort=False)
    return grouped[list(ENGINE_MEANS)].mean().join(grouped.size().rename("engine_requests")).reset_index()


def engine_figures(frame: pd.DataFrame) -> pd.DataFrame:
    """The compared engine figures of a table with ENGINE_MEANS and `output_tokens` (tokens asked per request):
    `engine_prefill_ms` (the mean prefill), `engine_decode_ms_per_token` (the mean decode time over
    output_tokens − 1, or where that is missing the mean time per output token) and `engine_preprocess_ms` (the mean
    TTFT less the mean queue and prefill times; NaN where it comes out negative, which no engine's clocks give);
    NaN where unknown."""
    out = pd.DataFrame(index=frame.index)
    out["engine_prefill_ms"] = _column(frame, "engine_prefill_ms_mean")
    steps = _column(frame, "output_tokens") - 1
    per_token = _column(frame, "engine_decode_ms_mean") / steps.where(steps > 0)
    out["engine_decode_ms_per_token"] = per_token.fillna(_column(frame, "engine_tpot_ms_mean"))
    before = (_column(frame, "engine_ttft_ms_mean") - _column(frame, "engine_queue_ms_mean")
              - out["engine_prefill_ms"])
    out["engine_preprocess_ms"] = before.where(before >= 0)
    return out


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    if name not in frame.columns:
        return pd.Series(math.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[name], errors="coerce").astype(float)


def lone_engine_cells(spec: ExperimentSpec, cells: pd.DataFrame) -> pd.DataFrame:
    """The cost model's engine figures (ENGINE_FIT_METRICS) for cells served one request at a time: `cells` has
    MATCH_KEYS, `prompt_tokens` (per request, images' and template tokens included), `image_px` (0 or NaN: none)
    and `output_tokens`; each cell's configuration must be aggregated (one engine serves the whole request).
    Returns MATCH_KEYS and the figures per cell; the preprocessing is what the simulator's API server does before
    its engine sees the request (sim.replica): tokenize the text (after the tokenizer's batch wait), then process the
    image; and the first token's way through the output path, which vLLM's TTFT holds and its prefill time (the
    engine core's clock) does not."""
    rows = []
    for cell in cells.to_dict("records"):
        config = spec.configuration(cell["config"])
        cost = CostModel(spec.model, spec.hardware, config.roles[0].tp)
        px = int(cell["image_px"]) if cell["image_px"] == cell["image_px"] and cell["image_px"] else 0
        out = int(cell["output_tokens"])
        times = lone_request(cost, spec.engine, int(round(cell["prompt_tokens"])),
                             [image_tokens(spec.model, px, px)] if px else [], out)
        per_token = times.decode_per_token_s(out)
        text = int(round(cell["prompt_tokens"])) - (image_tokens(spec.model, px, px) if px else 0)
        before = (TOKENIZER_BATCH_WAIT_S + tokenize_seconds(spec.hardware, text)
                  + image_preprocess_seconds(spec.hardware, [(px, px)] if px else [])
                  + output_seconds(spec.hardware, 1))
        rows.append({**{k: cell[k] for k in MATCH_KEYS}, "engine_prefill_ms": times.prefill_s * 1e3,
                     "engine_decode_ms_per_token": math.nan if per_token is None else per_token * 1e3,
                     "engine_preprocess_ms": before * 1e3})
    return pd.DataFrame(rows, columns=[*MATCH_KEYS, *ENGINE_FIT_METRICS])
