"""A truth table: a real engine's figures on a spec's cells, one row per load generator (`tool`) and cell, beside
which the simulator's are set (benchmarks/simulator/sim_vs_real.py) and to whose engine step timings it is fitted
(`epdbench calibrate --engine-steps`). Pure: checking, selecting and shaping the table; reading it is the caller's.

Columns (benchmarks/data/README.md): gpu (the CUDA device name), vllm_version, model, tool, config, suite,
workload (the spec's label: `1024/128`, `1260px+400/128`), input_tokens (text tokens asked), image_px (0: none),
output_tokens, concurrency, n_measured, requests_ok, prompt_tokens_mean (as the server counted them), the client
figures ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, itl_p99_ms, output_tok_s, req_s, and the engine's own means over
the cell (analysis.engine_steps.ENGINE_MEANS), the share of the cell's prompt tokens and images the engine's caches
served (CACHES: a truth row is meant to be cold), and the GPU over the cell (TELEMETRY). A figure not known is
empty, never 0.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from epdbench.analysis import table_check
from epdbench.analysis.engine_steps import ENGINE_MEANS, MATCH_KEYS, engine_figures

KEYS = ["gpu", "tool", "config", "suite", "workload", "concurrency"]
SHAPE = ["input_tokens", "image_px", "output_tokens"]
COUNTS = ["n_measured", "requests_ok", "prompt_tokens_mean"]
CLIENT_METRICS = ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "output_tok_s", "req_s"]
# The GPU over the cell, where the host could read it (nvidia-smi; analysis.gpu_telemetry): optional columns.
TELEMETRY = ["gpu_util_pct_mean", "gpu_mem_used_mib_max", "gpu_power_w_mean", "gpu_sm_clock_mhz_mean", "gpu_energy_j",
             "energy_j_per_token"]
# The engine's prefix and encoder caches over the cell, in % of the prompt tokens and images looked up
# (vllm:prefix_cache_hits_total / _queries_total, vllm:mm_cache_*): optional columns.
CACHES = ["engine_prefix_hit_pct", "engine_mm_hit_pct"]
# A row whose prefix cache served more than this share of its prompt tokens is left out (usable): one 16-token
# block of a chat template shared by every request is 1.9 % of the table's shortest chat prompt (821 tokens).
WARM_PREFIX_PCT = 2.0
# `stream` (optional, `main` when absent): the stream of a mixed window's row (specs.suites.MixedSuite), whose
# engine figures are the whole window's, every stream's requests together.
COLUMNS = ["gpu", "vllm_version", "model", "tool", "config", "suite", "workload", "stream", *SHAPE, "concurrency",
           *COUNTS, *CLIENT_METRICS, *ENGINE_MEANS, *CACHES, *TELEMETRY]
REQUIRED = [*KEYS, "input_tokens", "output_tokens"]
# What sim_vs_real sets side by side: the client's figures and the engine's.
COMPARED = ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "output_tok_s", "engine_prefill_ms",
            "engine_decode_ms_per_token", "engine_preprocess_ms"]
# A fixed shape's label, or a multimodal suite cell's, which its name leads (`reuse:1792px+400/64`)
_WORKLOAD = re.compile(r"(?:[a-z0-9][a-z0-9-]*:)?(?:(\d+)px\+)?(\d+)/(\d+)")


class TruthError(ValueError):
    """A truth table that cannot be used; the message is one line naming the row or column."""


def parse_workload(label: str) -> tuple[int, int, int] | None:
    """(image edge px or 0, input tokens, output tokens) of a fixed workload label (specs.suites.Shape.workload:
    `1024/128`, `1260px+400/128`), a stream's (StreamSpec.workload) or a multimodal cell's (ImageCell.workload:
    `reuse:1792px+400/64`); None for any other label."""
    m = _WORKLOAD.fullmatch(str(label).strip())
    return (int(m.group(1) or 0), int(m.group(2)), int(m.group(3))) if m else None


def check(frame: pd.DataFrame) -> None:
    """TruthError (one line) when a required column is missing, a key or figure cannot be read (the row named,
    analysis.table_check), a workload is no fixed shape or disagrees with the row's shape columns, or the rows
    name more than one GPU."""
    if missing := [c for c in REQUIRED if c not in frame.columns]:
        raise TruthError(f"no column(s) {', '.join(missing)}: a truth table has {', '.join(COLUMNS)}")
    numbers = [c for c in (*SHAPE, *COUNTS, *CLIENT_METRICS, *ENGINE_MEANS, *CACHES, *TELEMETRY)
               if c in frame.columns]
    if problem := table_check.unreadable(frame, KEYS, numbers):
        raise TruthError(problem)
    for pos, label in enumerate(frame.index):
        row = frame.iloc[pos]
        where = table_check.row_text(row, label, ["tool", "workload", "concurrency"])
        shape = parse_workload(row["workload"])
        if shape is None:
            raise TruthError(f"{where}: workload {row['workload']!r} is not a fixed shape's label such as 1024/128 or "
                             "1260px+400/128")
        given = (_whole(row["image_px"]) if "image_px" in row.index and not table_check.blank(row["image_px"]) else 0,
                 _whole(row["input_tokens"]), _whole(row["output_tokens"]))
        if given != shape:
            raise TruthError(f"{where}: image_px, input_tokens, output_tokens {given} are not the workload's {shape}")
    gpus = sorted({str(g).strip() for g in frame["gpu"]})
    if len(gpus) > 1:
        raise TruthError(f"rows of {len(gpus)} GPUs ({', '.join(gpus)}): one GPU's figures per table")


def _whole(value) -> int | None:
    x = pd.to_numeric(value, errors="coerce")
    return int(x) if x == x and float(x).is_integer() else None


def gpu_of(frame: pd.DataFrame) -> str:
    """The one GPU a checked table names."""
    return str(frame["gpu"].iloc[0]).strip()


def for_tool(frame: pd.DataFrame, tool: str) -> pd.DataFrame:
    """The rows of one load generator; TruthError naming the tools there when it has none."""
    tools = frame["tool"].astype(str).str.strip()
    if not (tools == tool).any():
        raise TruthError(f"no row of tool {tool!r}: the table has {', '.join(sorted(set(tools)))}")
    return frame[tools == tool]


def usable(frame: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """The rows whose every measured request succeeded (requests_ok = n_measured, where both are given): a cell
    with failed requests has figures of those that succeeded, where the simulator serves every one; and whose
    engine computed its prompts (CACHES: prefix hits up to WARM_PREFIX_PCT, no image from the encoder cache), as
    the simulator does. `notes` gets a line for each kind of row left out."""
    failed = pd.Series(0.0, index=frame.index)
    if {"n_measured", "requests_ok"} <= set(frame.columns):
        failed = (pd.to_numeric(frame["n_measured"], errors="coerce")
                  - pd.to_numeric(frame["requests_ok"], errors="coerce")).fillna(0)
    rows, said = table_check.usable(frame.assign(requests_failed=failed))
    notes.extend(said)
    rows = frame.loc[rows.index]
    hits = {c: pd.to_numeric(rows[c], errors="coerce") if c in rows.columns else pd.Series(math.nan, index=rows.index)
            for c in CACHES}
    warm = (hits["engine_prefix_hit_pct"] > WARM_PREFIX_PCT) | (hits["engine_mm_hit_pct"] > 0)
    if warm.any():
        most = hits["engine_prefix_hit_pct"][warm].max()
        notes.append(f"{int(warm.sum())} row{'s' if warm.sum() > 1 else ''} measured on a warm cache left out (prefix "
                     f"hits up to {0 if most != most else most:.0f} % of their prompt tokens, or images from the "
                     "encoder cache): the simulator computes every prompt")
    return rows[~warm]


def cells(frame: pd.DataFrame, notes: list[str] | None = None) -> pd.DataFrame:
    """One row per cell (index MATCH_KEYS; stream `main` where the table has none) of a checked
    table: the client figures, the compared engine figures (analysis.engine_steps.engine_figures), the shape and
    prompt_tokens_mean, rows of a cell averaged. A figure that is not positive is left out (NaN) and `notes` says
    so."""
    frame = frame.reset_index(drop=True)
    out = pd.DataFrame({k: frame[k].astype(str).str.strip() for k in ("config", "suite", "workload")})
    out["concurrency"] = pd.to_numeric(frame["concurrency"]).astype(int)
    out["stream"] = (frame["stream"].fillna("main").astype(str).str.strip().replace("", "main")
                     if "stream" in frame.columns else "main")
    values = pd.DataFrame({c: pd.to_numeric(frame[c], errors="coerce") if c in frame.columns else np.nan
                           for c in (*SHAPE, "prompt_tokens_mean", *CLIENT_METRICS)}, index=frame.index)
    engine = engine_figures(frame)
    values = values.join(engine)
    figures = [*CLIENT_METRICS, *engine.columns]
    if notes is not None and (note := table_check.non_positive(values, figures)):
        notes.append(note)
    values[figures] = values[figures].where(values[figures] > 0)
    return pd.concat([out, values], axis=1).groupby(MATCH_KEYS, sort=True).mean()


def as_truth_table(summary: pd.DataFrame, gpu: str, model: str, tool: str = "epdbench",
                   vllm_version: str = "") -> pd.DataFrame:
    """A table in the truth columns from a summary with engine means (tasks.sim.engine_times.simulate_cells):
    what the simulator predicts, written as a real engine's figures would be. Fixed-shape cells only."""
    rows = []
    for r in summary.to_dict("records"):
        shape = parse_workload(r["workload"])
        if shape is None:
            continue
        px, text, out = shape
        rows.append({"gpu": gpu, "vllm_version": vllm_version, "model": model, "tool": tool, "config": r["config"],
                     "suite": r["suite"], "workload": r["workload"], "stream": r.get("stream") or "main",
                     "input_tokens": text, "image_px": px,
                     "output_tokens": out, "concurrency": int(r["concurrency"]), "n_measured": r["requests_total"],
                     "requests_ok": r["requests_ok"], "prompt_tokens_mean": r["prompt_tokens_mean"],
                     **{c: _figure(r.get(c)) for c in (*CLIENT_METRICS, *ENGINE_MEANS)}})
    return pd.DataFrame(rows, columns=COLUMNS)


def _figure(value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan
