"""analysis/metrics.py against a plain-Python reference of its definitions, on seeded random records and edge
cases, with the chunk lists as Python lists (records built in memory) and Arrow-backed (as read_records gives)."""
from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from epdbench.analysis.metrics import CELL_KEYS, summarize, summarize_cell
from epdbench.analysis.noise import SAMPLE_CI_METRICS, Z95

MS = 1_000_000
LISTS = ("chunk_offsets_ns", "chunk_tokens", "chunk_arrival_ns")


# --- the reference: the module docstring's definitions, one request at a time ------------------------------

def num(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def pct(xs, q):
    return float(np.percentile(xs, q)) if xs else None


def ci(xs, q):
    """(larger half-width, low bound, high bound) of the percentile's order-statistic 95% CI."""
    xs, n, p = sorted(xs), len(xs), q / 100
    if n < 2:
        return None, None, None
    spread = Z95 * math.sqrt(n * p * (1 - p))
    lo, hi = xs[max(0, math.floor(n * p - spread) - 1)], xs[min(n - 1, math.ceil(n * p + spread))]
    k = (n - 1) * p
    f = math.floor(k)
    mid = xs[f] + (xs[min(n - 1, f + 1)] - xs[f]) * (k - f)
    return max(hi - mid, mid - lo), lo, hi


def p99_sorted(xs):
    xs = sorted(xs)
    k = (len(xs) - 1) * 0.99
    lo = math.floor(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


def window_of(rows):
    m = [r for r in rows if r["phase"] == "measured"]
    if not m:
        return None
    return (min(r["send_ns"] for r in m),
            int(max(r["send_ns"] + (r["done_ms"] if num(r["done_ms"]) else 0) * 1e6 for r in m)))


def reference_cell(rows, window=None) -> dict:
    m = [r for r in rows if r["phase"] == "measured"]
    ok = [r for r in m if bool(r["ok"])]
    itls = [(b - a) / 1e6 for r in ok for a, b in zip(r["chunk_offsets_ns"] or [], (r["chunk_offsets_ns"] or [])[1:])]
    ttfts = [r["ttft_ms"] for r in ok if num(r["ttft_ms"])]
    tpots = [(r["e2e_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1) for r in ok
             if num(r["ttft_ms"]) and num(r["e2e_ms"]) and num(r["output_tokens"]) and r["output_tokens"] >= 2]
    window = window or window_of(rows)
    window_s = (window[1] - window[0]) / 1e9 if window and window[1] > window[0] else None
    outs = [r["output_tokens"] for r in ok if num(r["output_tokens"])]
    out_sum = int(sum(outs)) if outs else None
    prompts = [r["prompt_tokens"] for r in ok if num(r["prompt_tokens"])]
    targets = [r["target_prompt_tokens"] for r in m if num(r["target_prompt_tokens"])]
    kinds = {r.get("timing") for r in ok if r.get("timing")}
    stamped = [r for r in ok if r.get("chunk_offsets_ns") is not None and r.get("chunk_arrival_ns") is not None
               and len(r["chunk_offsets_ns"]) == len(r["chunk_arrival_ns"])]
    lags = [(a - mo) / 1e9 for r in stamped for mo, a in zip(r["chunk_offsets_ns"], r["chunk_arrival_ns"])]
    samples = {"ttft": ttfts, "tpot": tpots, "itl": itls}
    return {
        "requests_ok": len(ok), "requests_total": len(m), "requests_failed": len(m) - len(ok),
        "n_ttft_samples": len(ok), "n_itl_samples": len(itls),
        "ttft_p50_ms": pct(ttfts, 50), "ttft_p95_ms": pct(ttfts, 95), "ttft_p99_ms": pct(ttfts, 99),
        "tpot_p50_ms": pct(tpots, 50), "itl_p99_ms": pct(itls, 99), "itl_max_ms": max(itls) if itls else None,
        "window_s": window_s, "output_tokens": out_sum,
        "output_tok_s": out_sum / window_s if out_sum is not None and window_s else None,
        "req_s": len(ok) / window_s if window_s and ok else None,
        "chunks_multi_token": sum(t > 1 for r in ok for t in r["chunk_tokens"] or []) if ok else None,
        "client_lag_p99_ms": pct([(r["send_ns"] - r["scheduled_ns"]) / 1e6 for r in m], 99),
        "prompt_tokens_mean": sum(prompts) / len(prompts) if prompts else None,
        "target_prompt_tokens": sum(targets) / len(targets) if targets else None,
        "timing": None if not kinds else kinds.pop() if len(kinds) == 1 else "mixed",
        **{f"{k}_sample_ci95{side}": v for k, q in SAMPLE_CI_METRICS.items()
           for side, v in zip(("", "_lo", "_hi"), ci(samples[k.split("_")[0]], q))},
        "delivery_lag_p99_ms": 1e3 * p99_sorted(lags) if lags and "chunk_arrival_ns" in rows[0] else None,
    }


def reference_summary(rows) -> list[dict]:
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in CELL_KEYS), []).append(r)
    shared = {}
    for r in rows:
        if r["stream"] != "main":
            shared.setdefault((r["config"], r["suite"], r["trial"]), []).append(r)
    return [{**dict(zip(CELL_KEYS, key)),
             **reference_cell(g, window_of(shared[key[0], key[1], key[5]]) if key[4] != "main" else None)}
            for key, g in groups.items()]


# --- records ----------------------------------------------------------------------------------------------

def random_records(seed: int, n: int = 300) -> list[dict]:
    """Cells of a plain and a mixed suite; warm-up, failed, refused and cut requests; 0, 1 or many chunks,
    multi-token chunks; missing lists and usage; modelled timing with arrivals, some of the wrong length."""
    rnd = random.Random(seed)
    cells = [dict(config=rnd.choice(["agg", "pd-tcp"]), suite="mixed" if j >= 4 else "fixed", workload="512/64",
                  concurrency=rnd.choice([1, 8]), stream=("short", "long")[j % 2] if j >= 4 else "main",
                  trial=rnd.choice([0, 1]), cell=f"c{j}") for j in range(6)]
    rows = []
    for _ in range(n):
        length = rnd.choice([0, 1, 2, 3, 8, 40])
        offs = sorted(rnd.randrange(1, 10 ** 10) for _ in range(length))
        tokens = [rnd.choice([1, 1, 1, 2, 4]) for _ in range(length)]
        ok = rnd.random() > 0.15
        timing = rnd.choice(["modelled", "arrival", None])
        arrival = [o + rnd.randrange(10 ** 6) for o in offs] if timing == "modelled" else []
        if timing == "modelled" and rnd.random() < 0.2:
            arrival = arrival[1:]
        send = 10 ** 15 + rnd.randrange(10 ** 11)
        rows.append({**rnd.choice(cells), "phase": "warmup" if rnd.random() < 0.1 else "measured", "ok": ok,
                     "ttft_ms": offs[0] / 1e6 if offs and rnd.random() > 0.05 else None,
                     "e2e_ms": offs[-1] / 1e6 if offs else None,
                     "done_ms": offs[-1] / 1e6 + rnd.random() if offs else rnd.choice([None, 2.5]),
                     "send_ns": send, "scheduled_ns": send - rnd.randrange(10 ** 7),
                     "output_tokens": rnd.choice([sum(tokens), sum(tokens), None, 1]) if ok else None,
                     "prompt_tokens": rnd.choice([100, 117, None]), "target_prompt_tokens": rnd.choice([100, None]),
                     "chunk_offsets_ns": offs if rnd.random() > 0.05 else None,
                     "chunk_tokens": tokens if rnd.random() > 0.05 else None,
                     "timing": timing, "chunk_arrival_ns": arrival if rnd.random() > 0.05 else None})
    return rows


def arrow_backed(rows: list[dict], pieces: int = 3) -> pd.DataFrame:
    """The frame with its chunk lists Arrow-backed in several chunks, as read_records gives them."""
    df = pd.DataFrame(rows)
    for name in LISTS:
        if name in df:
            whole = pa.array([rows[i][name] for i in range(len(rows))], type=pa.list_(pa.int64()))
            bounds = np.linspace(0, len(rows), pieces + 1).astype(int)
            chunks = [whole.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]
            df[name] = pd.Series(pd.arrays.ArrowExtensionArray(pa.chunked_array(chunks, type=whole.type)))
    return df


def assert_matches(got: dict, want: dict, label: str):
    for key, value in want.items():
        if value is None or isinstance(value, str):
            assert got[key] == value, (label, key, got[key], value)
        else:
            assert got[key] == pytest.approx(value, rel=1e-9, abs=0), (label, key, got[key], value)


def assert_summary(rows, frame):
    got = summarize(frame).to_dict("records")
    want = reference_summary(rows)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_matches(g, w, {k: w[k] for k in CELL_KEYS})


# --- tests -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_summary_matches_the_reference_on_random_records(seed):
    rows = random_records(seed)
    assert_summary(rows, pd.DataFrame(rows))
    assert_summary(rows, arrow_backed(rows))
    assert_summary(rows, pd.DataFrame(rows).astype(object))


def test_a_filtered_arrow_backed_frame_summarises_as_its_rows():
    rows = random_records(99)
    frame = arrow_backed(rows)
    keep = frame["config"] == "agg"
    assert_summary([r for r, k in zip(rows, keep) if k], frame[keep])
    assert_summary(rows[50:], frame.iloc[50:])


def base(**kw) -> dict:
    return {"config": "agg", "suite": "fixed", "workload": "w", "concurrency": 1, "stream": "main", "trial": 0,
            "cell": "c", "phase": "measured", "ok": True, "ttft_ms": 10.0, "e2e_ms": 30.0, "done_ms": 31.0,
            "send_ns": 10 ** 15, "scheduled_ns": 10 ** 15 - 5, "output_tokens": 3, "prompt_tokens": 100,
            "target_prompt_tokens": 100, "chunk_offsets_ns": [10 * MS, 20 * MS, 30 * MS], "chunk_tokens": [1, 1, 1],
            "timing": "arrival", "chunk_arrival_ns": [], **kw}


EDGES = {
    "all failed": [base(ok=False, ttft_ms=None, e2e_ms=None, output_tokens=None, chunk_offsets_ns=[], chunk_tokens=[],
                        send_ns=10 ** 15 + i) for i in range(3)],
    "no or one chunk": [base(chunk_offsets_ns=[], chunk_tokens=[]), base(chunk_offsets_ns=[5 * MS], chunk_tokens=[1],
                                                                         output_tokens=1),
                        base(chunk_offsets_ns=[7 * MS], chunk_tokens=[4], output_tokens=4)],
    "warm-up only": [base(phase="warmup")],
    "missing lists": [base(chunk_offsets_ns=None, chunk_tokens=None, chunk_arrival_ns=None),
                      base(send_ns=10 ** 15 + 7)],
    "output tokens missing": [base(output_tokens=float("nan")), base(output_tokens=None, send_ns=10 ** 15 + 1),
                              base(output_tokens=5.0, send_ns=10 ** 15 + 2)],
    "mixed streams share the window": [base(suite="mixed", stream=s, cell=f"m-{s}", send_ns=10 ** 15 + i * 10 ** 9,
                                            done_ms=1000.0 * (i + 1)) for i, s in enumerate("abab")]
    + [base(suite="mixed", stream="b", phase="warmup", send_ns=10 ** 14)],
    "timing mix": [base(timing="modelled", chunk_arrival_ns=[11 * MS, 22 * MS, 33 * MS]), base(timing="arrival"),
                   base(timing=None)],
    "no completion time": [base(done_ms=None)],
}


@pytest.mark.parametrize("case", EDGES)
def test_summary_matches_the_reference_on_edge_cases(case):
    rows = EDGES[case]
    assert_summary(rows, pd.DataFrame(rows))
    assert_summary(rows, arrow_backed(rows))
    assert_matches(summarize_cell(pd.DataFrame(rows)), reference_cell(rows), case)


def test_records_without_the_timing_columns():
    rows = [{k: v for k, v in base(send_ns=10 ** 15 + i).items() if k not in ("timing", "chunk_arrival_ns", "cell")}
            for i in range(3)]
    out = summarize(pd.DataFrame(rows)).iloc[0]
    assert out["timing"] is None and out["delivery_lag_p99_ms"] is None
    assert out["itl_p99_ms"] == pytest.approx(10.0)
