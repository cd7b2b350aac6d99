"""How long the per-cell summary of a run takes, and how much memory it needs, as records grow.

Writes N synthetic request records shaped like the load generator's (configurations × cells × trials, a
mixed suite whose streams share a window, warm-up and measured phases, a few failed requests, cells timed by
modelled stamps with their chunks' arrivals on record) to records.parquet with the results folder's schema,
then reads back the columns the summary needs with tasks.rundir.results.read_records and summarises them with analysis.metrics.summarize,
each in a fresh process, printing seconds and peak RSS.

    python benchmarks/pipeline/summarize.py [--records 1000000] [--chunks 64] [--cells 48] [--file /tmp/records.parquet]

An existing --file with the same record count is reused (--fresh writes it again).
"""
from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from epdbench.tasks.rundir.results import RECORD_SCHEMA

CONFIGS = ["agg", "pd-tcp", "pd-rdma", "epd"]
# (suite, workload, concurrency, stream); the two streams of "mixed" share their window
SHAPES = [("fixed", f"{p}/{o}", c, "main") for p, o in ((512, 64), (2048, 128), (8192, 32)) for c in (1, 8, 32)] \
    + [("mixed", "chat+rag", 8, "short"), ("mixed", "chat+rag", 8, "long")]
WARMUP = 0.04          # share of a cell's requests in the warm-up phase
FAILED = 0.005         # failed requests: half refused (no chunks), half cut after some chunks
NO_USAGE = 0.002       # successful requests without a usage block (output_tokens null)
MULTI_TOKEN = 0.02     # chunks carrying more than one token
MODELLED_EVERY = 3     # every third cell runs on the simulator: modelled stamps, arrivals on record


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cell_keys(j: int) -> dict:
    suite, workload, concurrency, stream = SHAPES[(j // len(CONFIGS)) % len(SHAPES)]
    return {"config": CONFIGS[j % len(CONFIGS)], "suite": suite, "workload": workload, "concurrency": concurrency,
            "stream": stream, "trial": j // (len(CONFIGS) * len(SHAPES)), "cell": f"{suite}-{workload}-c{concurrency}"
            + ("" if stream == "main" else f"-{stream}")}


def list_array(lengths: np.ndarray, values: np.ndarray, type_: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=type_.value_type), type=type_)


def cell_table(j: int, n: int, chunks: int, rng: np.random.Generator) -> pa.Table:
    k = cell_keys(j)
    modelled = j % MODELLED_EVERY == 0
    warm = np.arange(n) < max(1, int(n * WARMUP))
    fate = rng.random(n)
    refused, cut = fate < FAILED / 2, (fate >= FAILED / 2) & (fate < FAILED)
    ok = ~(refused | cut)
    lengths = rng.integers(chunks // 2, chunks * 3 // 2 + 1, n)
    lengths[rng.random(n) < 0.01] = 1                                    # one-chunk answers
    lengths[cut] = np.maximum(1, lengths[cut] // 3)
    lengths[refused] = 0
    total = int(lengths.sum())
    has = lengths > 0
    first = (np.cumsum(lengths) - lengths)[has]                          # each answer's first chunk
    ttft = (20e6 + 30e6 * rng.random(n)).astype(np.int64)
    gaps = (8e6 * (1 + 0.2 * rng.standard_gamma(2.0, total))).astype(np.int64)   # ~8 ms decode step, ns
    gaps[first] = ttft[has]
    cum = np.cumsum(gaps)
    offsets = cum - np.repeat(cum[first] - ttft[has], lengths[has])     # from the send
    tokens = np.where(rng.random(total) < MULTI_TOKEN, rng.integers(2, 5, total), 1).astype(np.int32)
    out_tokens = np.zeros(n, dtype=np.int64)
    ttft_ms, e2e_ms = np.full(n, np.nan), np.full(n, np.nan)
    if total:
        out_tokens[has] = np.add.reduceat(tokens, first)
        ttft_ms[has] = offsets[first] / 1e6
        e2e_ms[has] = offsets[first + lengths[has] - 1] / 1e6
    done_ms = np.where(has, e2e_ms + 0.1 + rng.random(n), 5.0 * rng.random(n))
    t0 = 10 ** 15 + (j // len(CONFIGS) if k["suite"] != "mixed" else 0) * 10 ** 11 + (j % len(CONFIGS)) * 10 ** 13
    send = t0 + np.cumsum(rng.exponential(30e6 / k["concurrency"], n)).astype(np.int64)
    scheduled = send - rng.exponential(5e4, n).astype(np.int64)
    timing = np.full(n, "modelled" if modelled else "arrival", dtype=object)
    if modelled:
        timing[rng.random(n) < 0.001] = "arrival"                        # stamps missing: timed by arrival
    stamped = np.repeat(timing == "modelled", lengths)
    arrival_lengths = np.where(timing == "modelled", lengths, 0)
    arrival = (offsets + rng.integers(0, 200_000, total))[stamped]
    prompt_target = int(k["workload"].split("/")[0]) if k["suite"] == "fixed" else 1024
    usage = ok & (rng.random(n) >= NO_USAGE)
    idx = np.arange(n)
    cols = {
        "run": pa.array(["bench"] * n), "trial": pa.array(np.full(n, k["trial"], dtype=np.int32)),
        "config": pa.array([k["config"]] * n), "suite": pa.array([k["suite"]] * n), "cell": pa.array([k["cell"]] * n),
        "workload": pa.array([k["workload"]] * n), "stream": pa.array([k["stream"]] * n),
        "concurrency": pa.array(np.full(n, k["concurrency"], dtype=np.int32)),
        "request_id": pa.array([f"{j}-{i}" for i in range(n)]), "index": pa.array(idx.astype(np.int32)),
        "phase": pa.array(np.where(warm, "warmup", "measured").tolist()), "api": pa.array(["completions"] * n),
        "target_prompt_tokens": pa.array(np.full(n, prompt_target, dtype=np.int32)),
        "prompt_tokens": pa.array(prompt_target + rng.integers(0, 8, n).astype(np.int32), mask=~usage),
        "max_tokens": pa.array(np.full(n, chunks * 2, dtype=np.int32)),
        "output_tokens": pa.array(out_tokens.astype(np.int32), mask=~usage),
        "cached_tokens": pa.array(np.zeros(n, dtype=np.int32), mask=~usage),
        "prompt_hash": pa.array([f"h{j}-{i}" for i in range(n)]), "image_px": pa.nulls(n, pa.int32()),
        "image_hash": pa.nulls(n, pa.string()), "scheduled_ns": pa.array(scheduled), "send_ns": pa.array(send),
        "send_wall_s": pa.array(send / 1e9), "ttft_ms": pa.array(ttft_ms, from_pandas=True),
        "e2e_ms": pa.array(e2e_ms, from_pandas=True), "done_ms": pa.array(done_ms),
        "chunk_offsets_ns": list_array(lengths, offsets, RECORD_SCHEMA.field("chunk_offsets_ns").type),
        "chunk_tokens": list_array(lengths, tokens, RECORD_SCHEMA.field("chunk_tokens").type),
        "status": pa.array(np.where(refused, 503, 200).astype(np.int32)), "ok": pa.array(ok),
        "error": pa.array(np.where(refused, "HTTP 503", np.where(cut, "stream ended without [DONE]", None)).tolist()),
        "timing": pa.array(timing.tolist()),
        "chunk_arrival_ns": list_array(arrival_lengths, arrival, RECORD_SCHEMA.field("chunk_arrival_ns").type),
    }
    return pa.table([cols[f.name] for f in RECORD_SCHEMA], schema=RECORD_SCHEMA)


def generate(path: Path, records: int, chunks: int, cells: int, seed: int = 0) -> None:
    """Write the records in one file of RECORD_SCHEMA, cell after cell, as tasks.rundir.results leaves it."""
    rng = np.random.default_rng(seed)
    sizes = [records // cells + (1 if j < records % cells else 0) for j in range(cells)]
    table = pa.concat_tables([cell_table(j, n, chunks, rng) for j, n in enumerate(sizes) if n])
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def measure(path: Path) -> dict:
    """Read, then summarise: seconds and peak RSS (MB) after each (run in a fresh process)."""
    from epdbench.analysis.metrics import RECORD_COLUMNS, summarize
    from epdbench.tasks.rundir.results import read_records
    base = peak_rss_mb()
    t0 = time.perf_counter()
    records = read_records(path, RECORD_COLUMNS)      # as flows.compare reads them for the summary
    t1 = time.perf_counter()
    read_mb = peak_rss_mb()
    summary = summarize(records)
    t2 = time.perf_counter()
    return {"base_mb": base, "read_s": t1 - t0, "read_mb": read_mb, "summarize_s": t2 - t1, "peak_mb": peak_rss_mb(),
            "rows": len(records), "cells": len(summary),
            "chunks": int(summary["n_ttft_samples"].sum() + summary["n_itl_samples"].sum())}


def in_fresh_process(fn, *args):
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--chunks", type=int, default=64, help="mean content chunks per request")
    ap.add_argument("--cells", type=int, default=48)
    ap.add_argument("--file", type=Path, default=Path("/tmp/epdbench-bench-records.parquet"))
    ap.add_argument("--fresh", action="store_true", help="write the records even if --file holds that many")
    args = ap.parse_args()
    if args.fresh or not args.file.exists() or pq.ParquetFile(args.file).metadata.num_rows != args.records:
        t0 = time.perf_counter()
        in_fresh_process(generate, args.file, args.records, args.chunks, args.cells)
        print(f"wrote {args.records} records ({args.chunks} chunks mean, {args.cells} cells) to {args.file}: "
              f"{args.file.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
    r = in_fresh_process(measure, args.file)
    print(f"{r['rows']} records, {r['cells']} cells, {r['chunks']} chunks of measured successful requests")
    print(f"read_records  {r['read_s']:7.2f} s   peak RSS {r['read_mb']:6.0f} MB (after imports {r['base_mb']:.0f} MB)")
    print(f"summarize     {r['summarize_s']:7.2f} s   peak RSS {r['peak_mb']:6.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
