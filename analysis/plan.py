"""What a spec will run, before anything starts: every cell per configuration with its counts, the
prompt-set hash and a duration estimate from the simulator's cost model (pure)."""
from __future__ import annotations

import math
from statistics import mean

from epdbench.analysis.labels import load_label
from epdbench.physics.costmodel import CostModel, PrefillChunk, image_tokens, kv_descriptors, transfer_seconds
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.specs.workload import Cell, build_requests, plan_cells, prompt_set_hash

STARTUP_S = 5.0   # processes and router of one configuration (simulator), per configuration


def _replicas(config: ConfigurationSpec, role: str) -> int:
    r = config.role(role)
    return r.replicas if r else 0


def estimate_cell_seconds(spec: ExperimentSpec, config: ConfigurationSpec, cell: Cell,
                          prompt_tokens: float, output_tokens: int, image_px: int | None,
                          image_reused: bool = False) -> float:
    """Closed-loop rounds × (batched prefill + KV handoff + decode at the per-replica batch); an open-loop
    cell, its arrivals' span plus one request's latency. A reused image is encoded, prefilled and handed
    off once: later requests find it in the caches."""
    decode_role = "server" if config.topology == "aggregated" else "decode"
    prefill_role = "server" if config.topology == "aggregated" else "prefill"
    tp_prefill = config.role(prefill_role).tp
    tp_decode = config.role(decode_role).tp
    in_flight = 1 if cell.rate else cell.concurrency
    per_prefill = max(1, math.ceil(in_flight / _replicas(config, prefill_role)))
    per_decode = max(1, math.ceil(in_flight / _replicas(config, decode_role)))
    n_tok = int(prompt_tokens)
    prefill = CostModel(spec.model, spec.hardware, tp_prefill)
    decode = CostModel(spec.model, spec.hardware, tp_decode)
    img_tok = image_tokens(spec.model, image_px, image_px) if image_px else 0
    cached = img_tok if image_reused else 0
    prefill_s = prefill.step_seconds([], [PrefillChunk(cached, max(1, n_tok - cached))] * per_prefill)
    if img_tok and not image_reused:
        prefill_s += prefill.encode_seconds([img_tok] * per_prefill)
    handoff_s = 0.0
    if config.topology != "aggregated":
        rdma = config.role("prefill").rdma_interfaces
        moved = max(1, n_tok - cached)
        handoff_s = per_prefill * transfer_seconds(spec.hardware, config.kv_transport, decode.kv_bytes(moved), rdma,
                                                   kv_descriptors(decode, config.kv_connector, moved),
                                                   config.kv_connector)
    decode_s = output_tokens * decode.step_seconds([n_tok] * per_decode, [])
    if cell.rate:
        return (cell.n_measured / cell.rate + (cell.n_warmup + 1) * (prefill_s + handoff_s + decode_s))
    rounds = math.ceil((cell.n_warmup + cell.n_measured) / cell.concurrency)
    busy_s = rounds * (prefill_s + handoff_s + decode_s)
    if cell.arrival == "burst":
        busy_s = max(busy_s, math.ceil(cell.n_measured / cell.burst_size) * cell.burst_interval_s)
    return busy_s


def plan(spec: ExperimentSpec) -> list[dict]:
    rows: list[dict] = []
    cells = plan_cells(spec)
    scale = spec.time_scale   # a dilated simulator runs slower
    requests = {c.cell_id: build_requests(spec, c) for c in cells}
    for config in spec.configurations:
        for cell in cells:
            reqs = requests[cell.cell_id]
            reused = reqs[0].image_hash is not None and len({r.image_hash for r in reqs}) == 1 < len(reqs)
            est = estimate_cell_seconds(spec, config, cell, mean(r.target_prompt_tokens for r in reqs),
                                        reqs[0].max_tokens, reqs[0].image_px, reused)
            rows.append({"config": config.name, "suite": cell.suite, "workload": cell.workload,
                         "concurrency": cell.concurrency, "rate": cell.rate,
                         "load": load_label(cell.workload, cell.concurrency), "stream": cell.stream,
                         "n_warmup": cell.n_warmup,
                         "n_measured": cell.n_measured, "prompt_set_hash": prompt_set_hash(reqs),
                         "est_seconds": round(est * spec.trials * scale, 1)})
    return rows


def total_seconds(spec: ExperimentSpec, rows: list[dict]) -> float:
    """Mixed streams run side by side: a mixed suite costs its longest stream."""
    by_suite: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by_suite.setdefault((r["config"], r["suite"]), []).append(r)
    total = STARTUP_S * len(spec.configurations)
    for (_, suite), rs in by_suite.items():
        mixed = any(r["stream"] != "main" for r in rs)
        total += max(r["est_seconds"] for r in rs) if mixed else sum(r["est_seconds"] for r in rs)
    return total
