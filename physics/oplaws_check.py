"""How closely the measured operator laws (physics.oplaws) reproduce a gpu_ops CSV: each row's time as the laws
give it at the row's shape on the measured GPU, and each row left out of the laws it helps build (what the
interpolation loses between measured shapes). Used by tests/physics/test_oplaws.py and
benchmarks/simulator/gpu_ops_vs_model.py."""
from __future__ import annotations

import math
from collections.abc import Sequence

from epdbench.physics.gpu_ops import OpRow
from epdbench.physics.measured import EngineLaws
from epdbench.physics.oplaws import ModelTables, Node, Peaks, build_tables
from epdbench.specs.node import ModelSpec

AS_MEASURED = Node(1.0, 1.0)


def row_class(r: OpRow) -> str | None:
    """The operator class a row is checked in (None: a ceiling or a part no law times on its own)."""
    if r.op.startswith("gemm."):
        return "GEMM"
    if r.op == "attn.prefill":
        return "prefill attention" if r.impl.startswith("flash-varlen") else "prefill attention (sdpa)"
    if r.op == "vision.tower":
        return "vision tower (eager)" if r.impl.startswith("eager") else "vision tower (CUDA graph)"
    return {"attn.decode": "decode attention", "decode_step": "decode step",
            "vision.attn_full": "vision full attention"}.get(r.op)


def predict_s(tables: ModelTables, model: ModelSpec, r: OpRow) -> float | None:
    """The laws' seconds for row `r` on the measured GPU (None: row_class is None)."""
    cls = row_class(r)
    laws = EngineLaws(tables, model.n_layers, r.tp or 1, AS_MEASURED)
    counts = [r.tokens // r.batch] * r.batch if r.op.startswith("vision.") else []
    if cls == "GEMM":
        return tables.gemm[r.tp][r.op.removeprefix("gemm.")].seconds(r.tokens, AS_MEASURED)
    if cls in ("prefill attention", "prefill attention (sdpa)"):
        return tables.prefill[r.tp].seconds_at_source(r.context - r.tokens, r.tokens)
    if cls == "decode attention":
        return tables.decode_attention[r.tp].seconds(r.batch, r.batch * r.context, AS_MEASURED)
    if cls == "decode step":
        return laws.decode_s(r.batch, r.batch * r.context)
    if cls == "vision tower (eager)":
        return laws.encode_s(counts)
    if cls == "vision tower (CUDA graph)":
        return tables.vision.gpu_seconds(counts)
    if cls == "vision full attention":
        return sum(n * n * tables.vision.full_per_pair.at(math.log(n)) for n in counts)
    return None


def _interior(r: OpRow, rows: Sequence[OpRow]) -> bool:
    """Whether a law-building row lies inside its law's grid (not at an end, where leaving it out would test
    extrapolation, not interpolation)."""
    same = [x for x in rows if (x.op, x.impl, x.model, x.tp) == (r.op, r.impl, r.model, r.tp)]
    if r.op.startswith("gemm."):
        axis, value = [x.tokens for x in same], r.tokens
    elif r.op == "attn.prefill":
        axis, value = [x.context for x in same if x.tokens == x.context], (r.context if r.tokens == r.context
                                                                            else None)
    elif r.op in ("attn.decode", "decode_step"):
        batches = [x.batch for x in same]
        if r.batch in (min(batches), max(batches)):
            return False
        axis, value = [x.context for x in same if x.batch == r.batch], r.context
    elif r.op == "vision.tower" and r.batch == 1:
        axis, value = [x.tokens for x in same if x.batch == 1], r.tokens
    else:
        return False
    return value is not None and min(axis) < value < max(axis)


def held_out(rows: Sequence[OpRow], model: ModelSpec, peaks: Peaks) -> list[tuple[OpRow, float]]:
    """(row, predicted / measured − 1) for every interior row of the laws of `model` (GEMMs, flash-varlen prefill
    attention, decode attention, decode steps, single-image CUDA-graph vision passes), each predicted by laws
    built from the other rows: the grid around it twice as coarse, an upper bound of what is lost between two
    measured shapes."""
    rows = list(rows)
    out = []
    for i, r in enumerate(rows):
        if r.model != model.name or row_class(r) not in ("GEMM", "prefill attention", "decode attention",
                                                         "decode step", "vision tower (CUDA graph)"):
            continue
        if not _interior(r, rows):
            continue
        tables = build_tables(rows[:i] + rows[i + 1:], model, peaks)
        out.append((r, predict_s(tables, model, r) * 1e3 / r.time_ms - 1))
    return out
