"""The cost model's operator laws measured on a GPU: prefill, decode and encode times as functions of their shapes,
interpolated from a gpu_ops CSV (benchmarks/gpu/gpu_ops.py) instead of one efficiency number.

The source by default is physics/data/gpu_ops_h200.csv: benchmarks/gpu/gpu_ops.py run on one NVIDIA H200 SXM on
2026-12-04 (benchmarks/data/README.md says how, and what differs from vLLM: PyTorch's FlashAttention-2, unfused
elementwise kernels in the decode step). Each law keeps the measured time at every measured shape and, between
and beyond them, the measured efficiency against the roofline of the shape at the measured GPU's datasheet
figures (H200 SXM: 989 TFLOP/s dense BF16, 4.8 TB/s), interpolated in log shape and held at the ends:
- GEMMs: every dense GEMM of a layer (QKV, O, gate-up, down) and the lm_head, per token count (1 to 8192);
- prefill attention (one layer, causal flash-varlen): per context length, with the measured loss of a chunk
  whose context is longer than its new tokens (prefix or chunked prefill);
- decode attention and the whole decode step (CUDA-graph replay, all layers, one rank): per batch and mean
  context; the step's cost beyond its GEMMs and attention at the smallest batch and context (norms, rotary
  embedding, KV write, activations, launch gaps: `residual`) is charged once per step of any kind;
- the vision tower per pass: what grows with the pass's tokens (its GEMMs over every patch of the pass, windowed
  attention, merger; linear beyond the largest image measured, never below the smallest: the fixed cost per
  pass) plus each image's full-attention blocks; launched from Python as vLLM runs it, a pass lasts at least the
  measured launch floor, and the measured launch gap longer than the GPU's own time.
A step with prefill costs its GEMMs over all its tokens (the lm_head over one token per sequence), each chunk's
attention, and the decodes' step beyond their GEMMs (or the residual if there are none).

Another node: a law's time is scaled by the ratio of the shape's roofline on that node (its datasheet figures
times measured_compute_factor and measured_hbm_factor) to the roofline on the measured GPU, so the compute-bound
parts keep the measured time where the compute figure is the same, and the memory-bound parts (small-batch GEMMs,
decode) follow the bandwidth: for the presets' H100 SXM (989 TFLOP/s, 3.35 TB/s) the same compute laws, memory
4.8 / 3.35 = 1.43 times slower. The residual and the vision tower's launch floor and gap are not scaled (host and
launch costs). A TP the CSV lacks for a model takes its nearest measured TP, the sharded time scaled by their
ratio (ideal sharding; Qwen3-32B's GEMMs measured at TP 1 take 1.7 to 2.15 times their TP 2 time). A model the CSV
lacks, or whose figures differ from the measured one's (physics.gpu_ops.LM_MODELS, VISION_MODELS), keeps the
roofline (costmodel.CostModel) and `describe` says so. The TP all-reduces have their own law (physics.allreduce).
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from epdbench.physics.gpu_ops import LM_MODELS, VISION_MODELS, OpRow, parse_ops_csv
from epdbench.specs.node import HardwareSpec, ModelSpec

SOURCE_CSV = Path(__file__).resolve().parent / "data" / "gpu_ops_h200.csv"
SOURCE_NAME = "physics/data/gpu_ops_h200.csv"
# NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: the measured GPU's figures the laws are relative to.
SOURCE_BF16_TFLOPS = 989.0
SOURCE_HBM_TB_S = 4.8
LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
LAUNCH_BOUND = 1.15   # an eager vision pass this much longer than its CUDA-graph replay is bound by its launches


@dataclass(frozen=True)
class Curve:
    """y at x, linear between the points (xs ascending; `geometric`: log y linear, for a positive y spanning
    decades); outside them the end value, or above them the last segment's slope (`slope_above`)."""
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    slope_above: bool = False
    geometric: bool = False

    @classmethod
    def of(cls, points: Iterable[tuple[float, float]], slope_above: bool = False, geometric: bool = False) -> Curve:
        merged: dict[float, list[float]] = defaultdict(list)
        for x, y in points:
            merged[x].append(y)
        xs = sorted(merged)
        return cls(tuple(xs), tuple(statistics.median(merged[x]) for x in xs), slope_above, geometric)

    def at(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        i = bisect.bisect_left(xs, x)
        if i < len(xs) and xs[i] == x:
            return ys[i]
        if i == 0:
            return ys[0]
        if i == len(xs):
            if self.slope_above and len(xs) > 1:
                return ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (x - xs[-1])
            return ys[-1]
        w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        if self.geometric:
            return ys[i - 1] ** (1 - w) * ys[i] ** w
        return ys[i - 1] + w * (ys[i] - ys[i - 1])


@dataclass(frozen=True)
class Node:
    """Where the laws are evaluated: seconds per FLOP and per byte there over those on the measured GPU."""
    compute: float
    memory: float

    def ratio(self, flops_s: float, bytes_s: float) -> float:
        """A shape's roofline here over on the measured GPU (its terms there: flops_s, bytes_s seconds)."""
        there = max(flops_s, bytes_s)
        return max(flops_s * self.compute, bytes_s * self.memory) / there if there > 0 else 1.0


@dataclass(frozen=True)
class Peaks:
    """The measured GPU's datasheet figures: a shape's roofline there is the larger of its FLOPs and bytes over them."""
    flops_s: float
    bytes_s: float

    def roofline(self, flops: float, n_bytes: float) -> tuple[float, float]:
        return flops / self.flops_s, n_bytes / self.bytes_s


@dataclass(frozen=True)
class GemmLaw:
    """y[M, n] = x[M, k]·Wᵀ of one rank: n·k and n + k from its rows; efficiency by log M."""
    nk: float
    n_plus_k: float
    efficiency: Curve
    peaks: Peaks

    def roofline(self, m: float) -> tuple[float, float]:
        return self.peaks.roofline(2 * m * self.nk, 2 * (self.nk + m * self.n_plus_k))

    def seconds(self, m: float, node: Node) -> float:
        if m <= 0:
            return 0.0
        f, b = self.roofline(m)
        return max(f, b) / self.efficiency.at(math.log(m)) * node.ratio(f, b)


@dataclass(frozen=True)
class PrefillAttentionLaw:
    """One layer's causal attention of q new tokens over a context of c (q ≤ c): time per unit of work
    q·(c − q/2) by log c from the full prefills (q = c; a power law between them, as the rate climbs steeply),
    times 1 + (1 − q/c)·loss, the loss of a chunk (q < c) interpolated between the measured chunks in log c at
    each measured q, then in log q; never below the fastest row (a kernel's fixed cost)."""
    per_work: Curve
    chunk_loss: tuple[tuple[float, Curve], ...]      # (log q, loss by log c)
    floor_s: float

    def loss(self, q: int, c: int) -> float:
        if not self.chunk_loss or q >= c:
            return 0.0
        lq, lc = math.log(q), math.log(c)
        qs = [x for x, _ in self.chunk_loss]
        i = bisect.bisect_left(qs, lq)
        if i == 0 or (i < len(qs) and qs[i] == lq):
            return self.chunk_loss[min(i, len(qs) - 1)][1].at(lc)
        if i == len(qs):
            return self.chunk_loss[-1][1].at(lc)
        w = (lq - qs[i - 1]) / (qs[i] - qs[i - 1])
        return (1 - w) * self.chunk_loss[i - 1][1].at(lc) + w * self.chunk_loss[i][1].at(lc)

    def seconds_at_source(self, start: int, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        c = start + tokens
        work = tokens * (c - tokens / 2)
        return max(self.floor_s, work * self.per_work.at(math.log(c)) * (1 + (1 - tokens / c) * self.loss(tokens, c)))


@dataclass(frozen=True)
class GridLaw:
    """A time over batch B and mean context C (decode attention, a decode step): efficiency against a roofline
    a·B + b·S FLOPs, c + d·S bytes (S = B·C), by log C at each measured batch, then in log B; held at the ends."""
    flops: tuple[float, float]
    bytes: tuple[float, float]
    batches: tuple[float, ...]                       # log B, ascending
    by_context: tuple[Curve, ...]                    # efficiency by log C, per batch
    peaks: Peaks

    def roofline(self, n: int, context_sum: float) -> tuple[float, float]:
        return self.peaks.roofline(self.flops[0] * n + self.flops[1] * context_sum,
                                   self.bytes[0] + self.bytes[1] * context_sum)

    def bracket(self, n: int) -> tuple[int, int, float]:
        lb = math.log(n)
        i = bisect.bisect_left(self.batches, lb)
        if i < len(self.batches) and self.batches[i] == lb:
            return i, i, 0.0
        if i == 0 or i == len(self.batches):
            j = min(i, len(self.batches) - 1)
            return j, j, 0.0
        return i - 1, i, (lb - self.batches[i - 1]) / (self.batches[i] - self.batches[i - 1])

    def efficiency_curve(self, where: tuple[int, int, float]) -> Curve:
        """The efficiency by log C at a batch between two measured ones (`where`: bracket), as one curve."""
        i, j, w = where
        if w == 0:
            return self.by_context[i]
        low, high = self.by_context[i], self.by_context[j]
        xs = sorted(set(low.xs) | set(high.xs))
        return Curve(tuple(xs), tuple((1 - w) * low.at(x) + w * high.at(x) for x in xs))

    def efficiency(self, where: tuple[int, int, float], mean_context: float) -> float:
        i, j, w = where
        lc = math.log(max(1.0, mean_context))
        low = self.by_context[i].at(lc)
        return low if w == 0 else low + w * (self.by_context[j].at(lc) - low)

    def seconds(self, n: int, context_sum: float, node: Node, where: tuple[int, int, float] | None = None) -> float:
        f, b = self.roofline(n, context_sum)
        return max(f, b) / self.efficiency(where or self.bracket(n), context_sum / n) * node.ratio(f, b)


@dataclass(frozen=True)
class VisionLaw:
    """A vision-tower pass on the measured GPU: linear(tokens of the pass) + full_blocks · Σ full(tokens of each
    image); eager, at least launch_floor_s, else launch_gap_s longer."""
    linear_s: Curve                 # by tokens: flat below the smallest image, the last slope above the largest
    full_per_pair: Curve            # one full-attention block's seconds / tokens², by log tokens
    full_blocks: int
    launch_floor_s: float
    launch_gap_s: float

    def gpu_seconds(self, counts: Sequence[int]) -> float:
        full = sum(n * n * self.full_per_pair.at(math.log(n)) for n in counts)
        return self.linear_s.at(float(sum(counts))) + self.full_blocks * full


@dataclass(frozen=True)
class ModelTables:
    """What a CSV measured of one model, per TP (a rank's times)."""
    gemm: dict[int, dict[str, GemmLaw]]
    prefill: dict[int, PrefillAttentionLaw]
    decode_attention: dict[int, GridLaw]
    decode_step: dict[int, GridLaw]
    residual_s: dict[int, float]                     # per TP with a measured step
    vision: VisionLaw | None
    missing: tuple[str, ...]                         # what the text laws lack, in words (empty: complete)


def nearest_tp(measured: Iterable[int], tp: int) -> int:
    """The measured TP closest to `tp` in ratio (the larger on a tie)."""
    return min(measured, key=lambda t: (abs(math.log(t / tp)), -t))


def _median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def _gemm_laws(rows: list[OpRow], peaks: Peaks) -> dict[int, dict[str, GemmLaw]]:
    groups: dict[tuple[int, str], list[OpRow]] = defaultdict(list)
    for r in rows:
        if r.op.startswith("gemm.") and r.tp and r.tokens:
            groups[(r.tp, r.op.removeprefix("gemm."))].append(r)
    out: dict[int, dict[str, GemmLaw]] = defaultdict(dict)
    for (tp, op), rs in groups.items():
        nk = _median(r.flops / (2 * r.tokens) for r in rs)
        n_plus_k = _median((r.bytes / 2 - nk) / r.tokens for r in rs)
        law = GemmLaw(nk, n_plus_k, Curve((), ()), peaks)
        out[tp][op] = GemmLaw(nk, n_plus_k, Curve.of(
            (math.log(r.tokens), max(law.roofline(r.tokens)) / (r.time_ms / 1e3)) for r in rs), peaks)
    return {tp: laws for tp, laws in out.items() if set(laws) >= {*LAYER_GEMMS, "lm_head"}}


def _prefill_laws(rows: list[OpRow]) -> dict[int, PrefillAttentionLaw]:
    by_tp: dict[int, list[OpRow]] = defaultdict(list)
    for r in rows:
        if r.op == "attn.prefill" and r.impl.startswith("flash-varlen") and r.tp and r.tokens and r.context \
                and r.tokens <= r.context and (r.batch or 1) == 1:
            by_tp[r.tp].append(r)
    out = {}
    for tp, rs in by_tp.items():
        full = [r for r in rs if r.tokens == r.context]
        if not full:
            continue
        per_work = Curve.of(((math.log(r.context), r.time_ms / 1e3 / (r.tokens * r.context / 2)) for r in full),
                            geometric=True)
        losses: dict[float, list[tuple[float, float]]] = defaultdict(list)
        for r in rs:
            if r.tokens < r.context:
                work = r.tokens * (r.context - r.tokens / 2)
                slower = r.time_ms / 1e3 / (work * per_work.at(math.log(r.context))) - 1
                losses[math.log(r.tokens)].append((math.log(r.context), slower / (1 - r.tokens / r.context)))
        out[tp] = PrefillAttentionLaw(per_work, tuple((q, Curve.of(pts)) for q, pts in sorted(losses.items())),
                                      min(r.time_ms for r in rs) / 1e3)
    return out


def _grid_law(rows: list[OpRow], flops: tuple[float, float], n_bytes: tuple[float, float], peaks: Peaks) -> GridLaw:
    probe = GridLaw(flops, n_bytes, (), (), peaks)
    by_batch: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        by_batch[r.batch].append((math.log(r.context), max(probe.roofline(r.batch, r.batch * r.context))
                                  / (r.time_ms / 1e3)))
    batches = sorted(by_batch)
    return GridLaw(flops, n_bytes, tuple(math.log(b) for b in batches),
                   tuple(Curve.of(by_batch[b]) for b in batches), peaks)


def _decode_laws(rows: list[OpRow], model: ModelSpec, peaks: Peaks, op: str) -> dict[int, GridLaw]:
    """Per TP, the grid law of `op` rows (attn.decode: one layer's; decode_step: the whole step of one rank), its
    roofline from the model's figures: weights' and attention's FLOPs, weights' and KV bytes."""
    by_tp: dict[int, list[OpRow]] = defaultdict(list)
    for r in rows:
        if r.op == op and r.tp and r.batch and r.context:
            by_tp[r.tp].append(r)
    out = {}
    for tp, rs in by_tp.items():
        attention = 4.0 * model.n_heads / tp * model.head_dim        # FLOPs per context token, one layer
        kv = model.kv_bytes_per_token_at(tp) / tp                     # bytes per context token, all layers
        if op == "attn.decode":
            flops, n_bytes = (0.0, attention), (0.0, kv / model.n_layers)
        else:
            flops = (2.0 * model.params_b * 1e9 / tp, attention * model.n_layers)
            n_bytes = (model.weight_bytes / tp, kv)
        out[tp] = _grid_law(rs, flops, n_bytes, peaks)
    return out


def _vision_law(rows: list[OpRow], full_blocks: int) -> VisionLaw | None:
    def single(op: str, impl: str) -> dict[int, float]:
        return {r.tokens: r.time_ms / 1e3 for r in rows
                if r.op == op and r.impl.startswith(impl) and r.batch == 1 and r.tokens}
    tower, full = single("vision.tower", "cuda-graph"), single("vision.attn_full", "flash-varlen")
    sizes = sorted(set(tower) & set(full))
    if not sizes:
        return None
    linear = Curve.of(((float(n), tower[n] - full_blocks * full[n]) for n in sizes), slope_above=True)
    pairs = Curve.of((math.log(n), full[n] / (n * n)) for n in sizes)
    graph = {(r.image_px, r.batch): r.time_ms / 1e3 for r in rows
             if r.op == "vision.tower" and r.impl.startswith("cuda-graph")}
    eager = [(r.time_ms / 1e3, graph[(r.image_px, r.batch)]) for r in rows if r.op == "vision.tower"
             and r.impl.startswith("eager") and (r.image_px, r.batch) in graph]
    bound = [e for e, g in eager if e >= LAUNCH_BOUND * g]
    gaps = [max(0.0, e - g) for e, g in eager if e < LAUNCH_BOUND * g]
    return VisionLaw(linear, pairs, full_blocks, _median(bound) if bound else 0.0, _median(gaps) if gaps else 0.0)


def model_problem(model: ModelSpec) -> str | None:
    """Why the measured rows of model.name are not this model's (its figures differ from the measured model's,
    physics.gpu_ops.LM_MODELS, VISION_MODELS), or None."""
    shape = LM_MODELS.get(model.name)
    if shape is not None and (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim) != (
            model.n_layers, model.hidden_size, model.n_heads, model.n_kv_heads, model.head_dim):
        return f"its layer figures differ from the measured {model.name}'s"
    vision, v = VISION_MODELS.get(model.name), model.vision
    if vision is not None and v is not None and (
            vision.depth, vision.hidden, vision.intermediate, vision.patch, vision.merge, vision.window_px,
            tuple(vision.fullatt_blocks)) != (v.depth, v.hidden_size, v.intermediate_size, v.patch_size,
                                              v.spatial_merge_size, v.window_size, tuple(v.fullatt_block_indexes)):
        return f"its vision tower's figures differ from the measured {model.name}'s"
    return None


def build_tables(rows: Sequence[OpRow], model: ModelSpec, peaks: Peaks) -> ModelTables:
    """The laws of `model` from a gpu_ops CSV's rows (physics.gpu_ops.read_ops_csv), its roofline taken at
    `peaks` (the measured GPU's datasheet figures)."""
    mine = [r for r in rows if r.model == model.name]
    gemm = _gemm_laws(mine, peaks)
    prefill = _prefill_laws(mine)
    attention = _decode_laws(mine, model, peaks, "attn.decode")
    steps = _decode_laws(mine, model, peaks, "decode_step")
    missing = tuple(what for what, have in (("GEMM rows of every layer GEMM and the lm_head", gemm),
                                            ("flash-varlen prefill attention rows", prefill),
                                            ("decode attention rows", attention), ("decode step rows", steps))
                    if not have)
    residual: dict[int, float] = {}
    if not missing:
        for tp, step in steps.items():
            n = round(math.exp(step.batches[0]))
            context = math.exp(step.by_context[0].xs[0])
            whole = step.seconds(n, n * context, Node(1.0, 1.0))
            g_tp, a_tp = nearest_tp(gemm, tp), nearest_tp(attention, tp)
            laws = gemm[g_tp]
            parts = (g_tp / tp * (model.n_layers * sum(laws[op].seconds(n, Node(1.0, 1.0)) for op in LAYER_GEMMS)
                                  + laws["lm_head"].seconds(n, Node(1.0, 1.0)))
                     + a_tp / tp * model.n_layers * attention[a_tp].seconds(n, n * context, Node(1.0, 1.0)))
            residual[tp] = min(whole, max(0.0, whole - parts))
    vision = _vision_law(mine, len(model.vision.fullatt_block_indexes)) if model.vision is not None else None
    return ModelTables(gemm, prefill, attention, steps, residual, vision, missing)


@functools.lru_cache(maxsize=16)
def _parsed(text: str, source: str) -> tuple[OpRow, ...]:
    return tuple(parse_ops_csv(text, source))


@functools.lru_cache(maxsize=32)
def tables_for(text: str, source: str, model_json: str, peaks: Peaks) -> ModelTables:
    """build_tables of a CSV's text for a model (as JSON, ModelSpec.model_dump_json), cached."""
    return build_tables(_parsed(text, source), ModelSpec.model_validate_json(model_json), peaks)


def digest(text: str) -> str:
    """The sha256 of a CSV's text: what a profile or spec records of the measurement it carries."""
    return hashlib.sha256(text.encode()).hexdigest()


TEXT_LAWS = ("GEMM", "prefill attention", "decode attention", "decode step")


def law_rows(rows: Iterable[OpRow]) -> dict[str, set[str]]:
    """Per model of a CSV, the laws its rows give (TEXT_LAWS, "vision tower"): a model needs every text law
    for the measured laws to time it."""
    ops: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        if r.model and (r.op != "attn.prefill" or r.impl.startswith("flash-varlen")) and \
                (r.op != "vision.tower" or r.impl.startswith("cuda-graph")):
            ops[r.model].add(r.op)
    need = {"GEMM": {f"gemm.{op}" for op in (*LAYER_GEMMS, "lm_head")}, "prefill attention": {"attn.prefill"},
            "decode attention": {"attn.decode"}, "decode step": {"decode_step"},
            "vision tower": {"vision.tower", "vision.attn_full"}}
    return {model: {law for law, wanted in need.items() if wanted <= have} for model, have in ops.items()}
