"""The measured operator laws (physics.oplaws) evaluated for one engine on one node: what costmodel.CostModel
charges when hardware.op_laws is `measured` and the measurement covers the model.

Where the timings come from: hardware.op_timings (a gpu_ops CSV carried whole, e.g. by a profile of
`epdbench calibrate --ops`), else physics/data/gpu_ops_h200.csv (an H200 SXM, benchmarks/data/README.md). Their
times are scaled to the node by the datasheet figures (oplaws.Node): for the presets' H100 SXM the compute-bound
parts as measured, the memory-bound ones by 4.8 / 3.35 TB/s.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from epdbench.physics.oplaws import (LAYER_GEMMS, SOURCE_BF16_TFLOPS, SOURCE_CSV, SOURCE_HBM_TB_S, SOURCE_NAME,
                                     ModelTables, Node, Peaks, model_problem, nearest_tp, tables_for)
from epdbench.specs.node import HardwareSpec, ModelSpec


@functools.lru_cache(maxsize=1)
def _default_text() -> str:
    return SOURCE_CSV.read_text(encoding="utf-8")


def source(hw: HardwareSpec) -> tuple[str, str, str, Peaks]:
    """(CSV text, its name, the GPU it was measured on, that GPU's datasheet figures) of the node's timings."""
    t = hw.op_timings
    if t is None:
        return _default_text(), SOURCE_NAME, "NVIDIA H200 SXM", Peaks(SOURCE_BF16_TFLOPS * 1e12,
                                                                      SOURCE_HBM_TB_S * 1e12)
    return t.csv, t.source, t.gpu, Peaks((t.bf16_tflops or hw.bf16_tflops) * 1e12, (t.hbm_tb_s or hw.hbm_tb_s) * 1e12)


def node_of(hw: HardwareSpec, peaks: Peaks) -> Node:
    return Node(compute=peaks.flops_s / (hw.bf16_tflops * 1e12 * hw.measured_compute_factor),
                memory=peaks.bytes_s / (hw.hbm_tb_s * 1e12 * hw.measured_hbm_factor))


def tables(model: ModelSpec, hw: HardwareSpec) -> tuple[ModelTables | None, str]:
    """(the measured laws of the model on this node's source, or None, and why none) — None under op_laws
    roofline, for a model the timings lack or do not match, or whose text laws are incomplete."""
    if hw.op_laws == "roofline":
        return None, "op_laws roofline"
    text, name, _, peaks = source(hw)
    if problem := model_problem(model):
        return None, f"{problem} in {name}"
    t = tables_for(text, name, model.model_dump_json(), peaks)
    if t.missing:
        return None, f"{name} has no {' nor '.join(t.missing)} of {model.name}"
    return t, ""


@dataclass(frozen=True)
class EngineLaws:
    """The laws of one engine (its model at TP `tp`) on a node: seconds of its steps and encoder passes."""
    tables: ModelTables
    layers: int
    tp: int
    node: Node
    vision_speed: float = 1.0     # hardware.measured_vision_factor: a vision pass takes its law's time over it

    @functools.cached_property
    def _tps(self) -> tuple[int, int, int, int]:
        t = self.tables
        return tuple(nearest_tp(laws, self.tp) for laws in (t.gemm, t.prefill, t.decode_attention, t.decode_step))

    @property
    def residual_s(self) -> float:
        """The step's cost beyond its GEMMs and attention (oplaws: not scaled by TP or datasheet)."""
        return self.tables.residual_s[self._tps[3]]

    def gemm_s(self, tokens: int, logits: int) -> float:
        """Every GEMM of a forward over `tokens` tokens, the lm_head over `logits` of them."""
        tp = self._tps[0]
        laws = self.tables.gemm[tp]
        layers = sum(laws[op].seconds(tokens, self.node) for op in LAYER_GEMMS)
        return tp / self.tp * (self.layers * layers + laws["lm_head"].seconds(logits, self.node))

    def prefill_attention_s(self, chunks: Sequence) -> float:
        """Causal attention of prefill chunks (costmodel.PrefillChunk: start, tokens), every layer."""
        tp = self._tps[1]
        law = self.tables.prefill[tp]
        work = sum(law.seconds_at_source(c.start, c.tokens) for c in chunks)
        return tp / self.tp * self.layers * work * self.node.compute

    def decode_s(self, n: int, context_sum: int) -> float:
        """A step of `n` decodes whose contexts add up to `context_sum` and nothing else."""
        return self.decode_fn(n)(context_sum) if n else 0.0

    @functools.cached_property
    def _decode_fns(self) -> dict:
        return {}

    def decode_fn(self, n: int):
        """decode_s for `n` decodes as a function of their context sum (sim.fused evaluates it step by step),
        kept per n."""
        if (fn := self._decode_fns.get(n)) is None:
            fn = self._decode_fns[n] = self._decode_fn(n)
        return fn

    def _decode_fn(self, n: int):
        tp = self._tps[3]
        law, residual, share = self.tables.decode_step[tp], self.tables.residual_s[tp], tp / self.tp
        efficiency, log_n = law.efficiency_curve(law.bracket(n)), math.log(n)
        peak_flops, peak_bytes = law.peaks.flops_s, law.peaks.bytes_s      # seconds at the source: a + b·S
        f0, f1 = law.flops[0] * n / peak_flops, law.flops[1] / peak_flops
        b0, b1 = law.bytes[0] / peak_bytes, law.bytes[1] / peak_bytes
        compute, memory = self.node.compute, self.node.memory

        def seconds(context_sum: float) -> float:       # GridLaw.seconds with the node's ratio, inlined
            f, b = f0 + f1 * context_sum, b0 + b1 * context_sum
            here = max(f, b)
            measured = here / efficiency.at(math.log(max(context_sum, n)) - log_n)
            return residual + (measured - residual) * max(f * compute, b * memory) / here * share
        return seconds

    def step_s(self, decode_contexts: Sequence[int], prefill: Sequence) -> float:
        """A continuous-batching step: its GEMMs over all its tokens (the lm_head over one per sequence), each
        prefill chunk's attention, and the decodes' step beyond their GEMMs — or the residual without decodes."""
        n, context_sum = len(decode_contexts), sum(decode_contexts)
        if not prefill:
            return self.decode_s(n, context_sum)
        tokens = n + sum(c.tokens for c in prefill)
        step = self.gemm_s(tokens, n + len(prefill)) + self.prefill_attention_s(prefill)
        decodes = self.decode_s(n, context_sum) - self.gemm_s(n, n) if n else 0.0
        return step + max(self.residual_s, decodes)

    @property
    def has_vision(self) -> bool:
        return self.tables.vision is not None

    def encode_s(self, counts: Sequence[int]) -> float:
        """One vision-tower pass over images of these LM-token counts: its GPU time (sharded over TP, scaled to
        the node's compute), at least the launch floor, else the launch gap longer; all of it over vision_speed."""
        v = self.tables.vision
        gpu = v.gpu_seconds(counts) * self.node.compute / self.tp
        return max(v.launch_floor_s, gpu + v.launch_gap_s) / self.vision_speed


def engine_laws(model: ModelSpec, hw: HardwareSpec, tp: int) -> EngineLaws | None:
    """The measured laws of an engine serving `model` at TP `tp` on `hw`, or None (the roofline: tables)."""
    t, _ = tables(model, hw)
    if t is None:
        return None
    return EngineLaws(t, model.n_layers, tp, node_of(hw, source(hw)[3]), hw.measured_vision_factor)


def vision_measured(model: ModelSpec, hw: HardwareSpec) -> bool:
    """Whether the cost model times `model`'s vision tower by the measured laws (what measured_vision_factor acts
    on): a vision model whose measured laws have vision rows."""
    t, _ = tables(model, hw)
    return model.vision is not None and t is not None and t.vision is not None


def law_sources(model: ModelSpec, hw: HardwareSpec, encodes: bool = True) -> set[str]:
    """The laws the cost model times `model`'s operators with on `hw`: "measured", "roofline" or both (measured
    text laws, the vision tower on the roofline for lack of vision rows, if the engines `encodes` images)."""
    t, _ = tables(model, hw)
    if t is None:
        return {"roofline"}
    return {"measured", "roofline"} if encodes and model.vision is not None and t.vision is None else {"measured"}


def describe(model: ModelSpec, hw: HardwareSpec) -> str:
    """Which laws the cost model uses for `model` on `hw`, in one line (for reports and the CLI)."""
    roofline = (f"roofline: datasheet {hw.bf16_tflops:g} TFLOP/s × {hw.compute_efficiency:g}, "
                f"{hw.hbm_tb_s:g} TB/s × {hw.hbm_efficiency:g}")
    t, why = tables(model, hw)
    if t is None:
        return roofline + (f" (no measured laws: {why})" if why != "op_laws roofline" else "")
    _, name, gpu, peaks = source(hw)
    node = node_of(hw, peaks)
    scaled = ("as measured" if node == Node(1.0, 1.0) else
              f"scaled to {hw.bf16_tflops * hw.measured_compute_factor:g} TFLOP/s and "
              f"{hw.hbm_tb_s * hw.measured_hbm_factor:g} TB/s from the measured GPU's "
              f"{peaks.flops_s / 1e12:g} and {peaks.bytes_s / 1e12:g}")
    vision = ("" if model.vision is None else "; the vision tower on the roofline (no vision rows)"
              if t.vision is None else f"; the vision tower {hw.measured_vision_factor:g} times as fast"
              if hw.measured_vision_factor != 1 else "")
    return f"measured on {gpu} ({name}), {scaled}{vision}"
