"""A synthetic comparison for report tests (deterministic, no processes): request records for every
planned cell of a spec with latency profiles per topology, plus meta and verdicts shaped like the flow's."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from epdbench.physics.costmodel import image_tokens
from epdbench.specs.models import ExperimentSpec
from epdbench.specs.workload import Cell, plan_cells
from epdbench.tasks.rundir.results import RECORD_SCHEMA

# per topology: TTFT ms per 1k prompt tokens, base ITL ms, an ITL spike (ms) every 8th gap on long prompts
PROFILE = {"aggregated": (30.0, 8.0, 120.0), "pd": (42.0, 7.5, 0.0), "epd": (50.0, 7.4, 0.0)}
MAX_REQUESTS_PER_CELL = 8


def shape_of(spec: ExperimentSpec, cell: Cell, rng) -> tuple[int, int]:
    """(target prompt tokens, max_tokens) of one request, read from the cell's workload name."""
    text, out = cell.workload.split("@", 1)[0].rsplit("/", 1)     # a rate cell: 4096/128@2/s
    image = re.search(r"(\d+)px\+(\d+)", text)
    if image:
        px, words = int(image.group(1)), int(image.group(2))
        return words + image_tokens(spec.model, px, px) + spec.model.chat_overhead_tokens, int(out)
    if "-" in text:
        lo, hi = map(int, text.split("-"))
        return int(rng.integers(lo, hi + 1)), int(out)
    return int(text), int(out)


def request_row(spec, config, cell: Cell, i: int, trial: int, rng, t0_ns: int) -> dict:
    ttft_per_1k, itl_ms, spike_ms = PROFILE[config.topology]
    prompt, max_tokens = shape_of(spec, cell, rng)
    ttft = ttft_per_1k * prompt / 1000 * (1 + 0.05 * rng.random()) + 5
    gaps = itl_ms * (1 + 0.05 * rng.random(max_tokens - 1))
    if spike_ms and prompt >= 2048:
        gaps[::8] += spike_ms
    offsets = (np.concatenate([[ttft], ttft + np.cumsum(gaps)]) * 1e6).astype(np.int64)
    send = t0_ns + (i // cell.concurrency) * int(offsets[-1])
    return {"run": "synthetic", "trial": trial, "config": config.name, "suite": cell.suite, "cell": cell.cell_id,
            "workload": cell.workload, "stream": cell.stream, "concurrency": cell.concurrency,
            "request_id": f"{config.name}-{cell.cell_id}-{trial}-{i}", "index": i, "phase": "measured",
            "api": "chat" if "px" in cell.workload else "completions", "target_prompt_tokens": prompt,
            "prompt_tokens": prompt, "max_tokens": max_tokens, "output_tokens": max_tokens, "cached_tokens": 0,
            "prompt_hash": f"h{cell.cell_id}{i}", "image_px": None, "image_hash": None, "scheduled_ns": send,
            "send_ns": send, "send_wall_s": send / 1e9, "ttft_ms": float(ttft), "e2e_ms": offsets[-1] / 1e6,
            "done_ms": offsets[-1] / 1e6, "chunk_offsets_ns": offsets.tolist(), "chunk_tokens": [1] * max_tokens,
            "status": 200, "ok": True, "error": None}


def synthetic_records(spec: ExperimentSpec, seed: int = 0) -> pd.DataFrame:
    """Records of every configuration × planned cell × trial (measured requests only)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, config in enumerate(spec.configurations):
        for cell in plan_cells(spec):
            for trial in range(spec.trials):
                t0 = 10 ** 12 * (1 + c) + 10 ** 11 * trial     # the streams of a mixed suite start together
                n = min(cell.n_measured, MAX_REQUESTS_PER_CELL)
                rows += [request_row(spec, config, cell, i, trial, rng, t0) for i in range(n)]
    df = pd.DataFrame(rows, columns=[f.name for f in RECORD_SCHEMA])
    return df.astype(object).where(df.notna(), None)


def synthetic_meta(spec: ExperimentSpec, failures: dict | None = None) -> dict:
    return {"title": f"epdbench: {spec.name} on {'simulator (emulated hardware)' if spec.target.kind == 'sim' else 'Kubernetes'}",
            "run": f"{spec.name}-synthetic", "spec": spec.name, "target": spec.target.kind, "model": spec.model.name,
            "hardware": f"{spec.hardware.gpu} figures", "seed": spec.seed, "trials": spec.trials,
            "created": "2026-01-01T00:00:00",
            "configurations": [{"name": c.name, "topology": c.topology,
                                "roles": " + ".join(f"{r.replicas}×{r.role} TP{r.tp}" for r in c.roles),
                                "gpus": c.gpus, "transport": c.kv_transport,
                                "router": "epdbench-proxy" if c.topology == "epd" else "vllm-router"}
                               for c in spec.configurations],
            "failures": failures or {},
            "reuse_suites": [s.name for s in spec.suites if getattr(s, "reuse_image", False)]}


def synthetic_cache(config, suite) -> dict:
    """Per-role cache view of a suite: the prefilling role queries its prefix cache, the role that runs the
    vision encoder its encoder cache; a suite that reuses its image hits both."""
    reuse = getattr(suite, "reuse_image", False)
    prefill_role = "server" if config.topology == "aggregated" else "prefill"
    view = {prefill_role: {"prefix_queries": 32768.0, "prefix_hit_rate": 0.82 if reuse else 0.0,
                           "mm_queries": 0.0, "mm_hit_rate": None, "kv_transfer_tokens": 0.0}}
    if suite.kind == "multimodal":
        encoder_role = "encode" if config.topology == "epd" else prefill_role
        view.setdefault(encoder_role, {"prefix_queries": 0.0, "prefix_hit_rate": None, "kv_transfer_tokens": 0.0})
        view[encoder_role].update({"mm_queries": 8.0, "mm_hit_rate": 0.875 if reuse else 0.0})
    return view


def synthetic_verdicts(spec: ExperimentSpec, transport: dict | None = None) -> dict:
    """Verdict views as the flow writes them; `transport` overrides a configuration's transport verdict."""
    out = {}
    for c in spec.configurations:
        roles = [r.role for r in c.roles]
        kv = c.topology != "aggregated"
        verdict = (transport or {}).get(c.name, "emulated" if kv else "not-applicable")
        out[c.name] = {
            "transport": verdict, "transport_reasons": [f"{c.name}: transport {verdict}"],
            "stages": "emulated", "stage_reasons": [f"every measured request was seen at {', '.join(roles)}"],
            "fraction_seen": {r: 1.0 for r in roles},
            "observed": {f"{r}-0": c.kv_transport for r in roles if r in ("prefill", "decode")} if kv else {},
            "rdma_devices": ["mlx5_0 (LID 7)"] if c.kv_transport == "rdma" else [],
            "throughput_mb_s_min": 900.0 if kv else None, "throughput_mb_s_max": 1200.0 if kv else None,
            "failed_transfers": 0, "failed_recvs": 0,
            "per_role": {r: {"completions": 8, "renders": 0, "errors": 0, "request_ids": 8}
                         for r in roles},
            "suites": {s.name: {"verdict": "emulated", "fraction_seen": {r: 1.0 for r in roles},
                                "kv_bytes": 2.0e9 if kv else 0, "cache": synthetic_cache(c, s)} for s in spec.suites},
        }
    return out
