"""The cost model beside the operator timings measured on a GPU (benchmarks/gpu/gpu_ops.py's CSV), per operator class.

The cost model (physics.costmodel.CostModel) runs under both its operator laws (hardware.op_laws): roofline (the
datasheet figures × the preset's compute and HBM efficiencies, as before the measured laws) and measured (the laws
physics.oplaws derives from physics/data/gpu_ops_h200.csv, the default), on the presets' models
(pd-text: Qwen3-32B; epd-multimodal: Qwen2.5-VL-7B) with the preset's hardware made an H200 by NVIDIA's H200 Tensor
Core GPU datasheet (H200 SXM: 989 TFLOP/s dense BF16, 4.8 TB/s HBM3e, 141 GB). Classes, model against measurement:
- ceilings (roofline only: the measured laws have no one rate): compute_efficiency × peak and hbm_efficiency ×
  bandwidth against the measured 8192³ product and copy;
- GEMM: every dense GEMM of one forward over M tokens (the layers' QKV, O, gate-up, down, and the lm_head), as
  the model charges them (roofline: max(2·params·M / FLOP/s, weights / bandwidth)) — step_seconds without
  attention, TP all-reduces and the step overhead;
- prefill attention: attention_flops(start, tokens) / FLOP/s (measured: the attention law) against the
  flash-varlen rows × layers;
- prefill (composite): a whole prompt of M tokens from the rows (GEMMs and attention × layers, lm_head once)
  against step_seconds of that prefill less its tail (all-reduces, step overhead) and, under the measured laws,
  its residual (norms, rotary, activations), which no GPU row holds;
- decode step: decode_step_seconds(B, B·C) less its tail, against the CUDA-graph step (one rank: at TP 2 the
  model's TP-group time is one rank's); beside it the step's GEMM and decode-attention rows added up (what the
  step spends beyond them is its elementwise kernels and launch gaps);
- vision tower: encode_seconds of the pass's images against the tower launched eagerly (as vLLM runs it, and as
  the measured laws charge it: at least the launch floor) and replayed from a CUDA graph (the GPU's own time).
ratio = measured / model: above 1 the model is optimistic. Under the measured laws the CSV given is their source
too (a gpu_ops CSV of another GPU: the laws of that GPU, on H200 figures), so at the measured shapes they agree by
construction; tests/physics/test_oplaws.py checks how much they lose between them.

    python benchmarks/simulator/gpu_ops_vs_model.py [--csv physics/data/gpu_ops_h200.csv] [--all] [--markdown]
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

from epdbench.physics.costmodel import CostModel, PrefillChunk
from epdbench.physics.gpu_ops import LM_MODELS, GpuOpsError, OpRow, read_ops_csv
from epdbench.physics.oplaws import SOURCE_CSV, digest
from epdbench.specs.models import load_spec
from epdbench.specs.node import OperatorTimings

CSV = SOURCE_CSV
LAWS = ("roofline", "measured")
PRESETS = {"Qwen/Qwen3-32B": "pd-text", "Qwen/Qwen2.5-VL-7B-Instruct": "epd-multimodal"}
# NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column.
H200 = {"gpu": "H200-SXM-141GB", "bf16_tflops": 989.0, "hbm_tb_s": 4.8, "hbm_gb": 141.0}
LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
CLASSES = ("ceiling", "GEMM", "prefill attention", "prefill (composite)", "decode step", "vision tower (eager)",
           "vision tower (CUDA graph)")
SHOWN_TOKENS = (1, 64, 512, 2048, 8192)
SHOWN_BATCHES = (1, 32, 128, 256)
SHOWN_IMAGES = ((224, 1), (560, 1), (840, 1), (1260, 1), (1792, 1), (560, 4))


@functools.lru_cache(maxsize=None)
def cost_model(model: str, tp: int, laws: str = "measured", csv: Path = CSV) -> CostModel:
    """The preset's cost model of `model` at TP `tp` on H200 figures, under `laws`, the measured ones from `csv`."""
    spec = load_spec(PRESETS[model])
    update = {**H200, "op_laws": laws}
    if laws == "measured" and Path(csv).resolve() != CSV:
        text = Path(csv).read_text(encoding="utf-8")
        update["op_timings"] = OperatorTimings(source=str(csv), gpu=read_ops_csv(csv)[0].gpu, sha256=digest(text),
                                               bf16_tflops=H200["bf16_tflops"], hbm_tb_s=H200["hbm_tb_s"], csv=text)
    return CostModel(spec.model, spec.hardware.model_copy(update=update), tp)


def gemm_model_s(cm: CostModel, m: int) -> float:
    """Every GEMM of a forward over m tokens as the cost model charges them."""
    if cm.laws is not None:
        return cm.laws.gemm_s(m, m)
    return max(2 * cm.model.params_b * 1e9 * m / cm.flops_per_s, cm.model.weight_bytes / cm.bytes_per_s)


def attention_model_s(cm: CostModel, start: int, tokens: int) -> float:
    if cm.laws is not None:
        return cm.laws.prefill_attention_s([PrefillChunk(start, tokens)])
    return cm.attention_flops(start, tokens) / cm.flops_per_s


def index(rows: list[OpRow]) -> dict[tuple, OpRow]:
    """Rows by (op, impl prefix, model, tp, tokens, batch, context, image_px)."""
    return {(r.op, r.impl.split(" ")[0], r.model, r.tp, r.tokens, r.batch, r.context, r.image_px): r for r in rows}


def gemm_ms(ix: dict, model: str, tp: int, m: int, lm_head_tokens: int | None = None) -> float | None:
    """All GEMMs of one forward over m tokens: the layers' four, and the lm_head over lm_head_tokens (default m)."""
    layers = LM_MODELS[model].layers
    parts = [ix.get((f"gemm.{op}", "F.linear", model, tp, m, None, None, None)) for op in LAYER_GEMMS]
    head = ix.get(("gemm.lm_head", "F.linear", model, tp, lm_head_tokens or m, None, None, None))
    if any(p is None for p in parts) or head is None:
        return None
    return layers * sum(p.time_ms for p in parts) + head.time_ms


def tail_s(cm: CostModel, tokens: int) -> float:
    return cm.allreduce_s(tokens) + cm.hw.step_overhead_ms / 1e3


def comparisons(rows: list[OpRow], full: bool = False, laws: str = "measured", csv: Path = CSV) -> list[dict]:
    """One dict per compared case: class, case, measured_ms, model_ms, ratio (and what else the class shows),
    the model under `laws` (the measured ones from `csv`)."""
    ix, out = index(rows), []

    def cost_model(model: str, tp: int) -> CostModel:
        return globals()["cost_model"](model, tp, laws, csv)

    def add(cls: str, case: str, measured: float, model: float, note: str = "") -> None:
        out.append(dict(cls=cls, case=case, measured_ms=measured, model_ms=model, ratio=measured / model, note=note))

    peak = next((r for r in rows if r.op == "peak.gemm"), None)
    copy = max((r for r in rows if r.op == "peak.copy"), key=lambda r: r.bytes / r.time_ms, default=None)
    hw = cost_model("Qwen/Qwen3-32B", 1)
    if laws != "roofline":          # the measured laws have no one rate to set beside the ceilings
        peak = copy = None
    if peak:
        add("ceiling", "bf16 GEMM 8192³ TFLOP/s", peak.flops / peak.time_ms / 1e9, hw.flops_per_s / 1e12,
            "ratio: measured / model rate")
    if copy:
        add("ceiling", "HBM copy TB/s", copy.bytes / copy.time_ms / 1e9, hw.bytes_per_s / 1e12,
            copy.impl.split(" (")[0])
    for model, shape in LM_MODELS.items():
        for tp in sorted({r.tp for r in rows if r.model == model and r.op.startswith("gemm.")}):
            cm = cost_model(model, tp)
            tokens = sorted({r.tokens for r in rows if r.model == model and r.tp == tp and r.op == "gemm.qkv"})
            for m in tokens if full else [t for t in tokens if t in SHOWN_TOKENS]:
                ms = gemm_ms(ix, model, tp, m)
                if ms is not None:
                    add("GEMM", f"{short(model)} tp{tp} M={m}", ms, gemm_model_s(cm, m) * 1e3)
            for r in sorted((r for r in rows if r.op == "attn.prefill" and r.model == model and r.tp == tp
                             and r.impl.startswith("flash-varlen")), key=lambda r: (r.context, r.tokens)):
                if full or r.tokens in SHOWN_TOKENS + (32768,) or r.tokens != r.context:
                    model_s = attention_model_s(cm, r.context - r.tokens, r.tokens)
                    add("prefill attention", f"{short(model)} tp{tp} {r.tokens}/{r.context}",
                        r.time_ms * shape.layers, model_s * 1e3)
            for m in tokens:
                attn = ix.get(("attn.prefill", "flash-varlen", model, tp, m, 1, m, None))
                ms = gemm_ms(ix, model, tp, m, lm_head_tokens=1)
                if attn is None or ms is None or not (full or m in SHOWN_TOKENS):
                    continue
                model_s = cm.step_seconds([], [PrefillChunk(0, m)]) - tail_s(cm, m)
                model_s -= cm.laws.residual_s if cm.laws is not None else 0.0
                add("prefill (composite)", f"{short(model)} tp{tp} {m} tokens", ms + attn.time_ms * shape.layers,
                    model_s * 1e3, "GEMMs + attention rows")
    for r in sorted((r for r in rows if r.op == "decode_step"), key=lambda r: (r.model, r.batch, r.context)):
        if full or r.batch in SHOWN_BATCHES:
            cm = cost_model(r.model, r.tp)
            whole = cm.decode_step_seconds(r.batch, r.batch * r.context)
            attn = ix.get(("attn.decode", "flash", r.model, r.tp, None, r.batch, r.context, None))
            gemm = gemm_ms(ix, r.model, r.tp, r.batch)
            parts = (f"; GEMM + attention rows {gemm + attn.time_ms * r.layers:.2f}"
                     if attn is not None and gemm is not None else "")
            add("decode step", f"{short(r.model)} tp{r.tp} B={r.batch} C={r.context}", r.time_ms,
                (whole - tail_s(cm, r.batch)) * 1e3, f"model with tail {whole * 1e3:.2f}{parts}")
    for r in sorted((r for r in rows if r.op == "vision.tower"), key=lambda r: (r.impl, r.batch, r.image_px)):
        if full or (r.image_px, r.batch) in SHOWN_IMAGES:
            cm = cost_model(r.model, 1)
            model_s = cm.encode_seconds([r.tokens // r.batch] * r.batch)
            add("vision tower (eager)" if r.impl.startswith("eager") else "vision tower (CUDA graph)",
                f"{r.batch}x{r.image_px}px", r.time_ms, model_s * 1e3)
    return sorted(out, key=lambda c: CLASSES.index(c["cls"]))


def short(model: str) -> str:
    return model.split("/")[-1].replace("-Instruct", "")


def summary(rows: list[OpRow], csv: Path = CSV) -> list[dict]:
    """Per class: cases, and the median and range of measured / model under each law."""
    out = []
    every = {laws: comparisons(rows, True, laws, csv) for laws in LAWS}
    for cls in CLASSES:
        line = {"cls": cls, "cases": max(sum(c["cls"] == cls for c in every[laws]) for laws in LAWS)}
        for laws in LAWS:
            ratios = [c["ratio"] for c in every[laws] if c["cls"] == cls]
            line[laws] = (statistics.median(ratios), min(ratios), max(ratios)) if ratios else None
        out.append(line)
    return out


def markdown(rows: list[OpRow], csv: Path = CSV) -> str:
    """The per-class summary as a Markdown table (docs/simulator.md)."""
    def cell(r):
        return f"{r[0]:.2f} ({r[1]:.2f}–{r[2]:.2f})" if r else "–"
    lines = ["| operator class | cases | measured / roofline model | measured / measured-law model |",
             "| --- | ---: | --- | --- |"]
    lines += [f"| {s['cls']} | {s['cases']} | {cell(s['roofline'])} | {cell(s['measured'])} |"
              for s in summary(rows, csv)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", type=Path, default=CSV, help="a gpu_ops CSV")
    ap.add_argument("--all", action="store_true", help="every measured case, not a selection")
    ap.add_argument("--markdown", action="store_true", help="only the per-class summary, as a Markdown table")
    args = ap.parse_args(argv)
    try:
        rows = read_ops_csv(args.csv)
    except GpuOpsError as exc:
        print(f"gpu_ops_vs_model: {exc}", file=sys.stderr)
        return 2
    meta = rows[0]
    print(f"{args.csv}: {meta.gpu}, driver {meta.driver}, torch {meta.torch}, {meta.date:%Y-%m-%d}; "
          f"model on H200 datasheet figures ({H200['bf16_tflops']:.0f} TFLOP/s, {H200['hbm_tb_s']} TB/s); "
          "ratio = measured / model under the roofline laws and under the measured ones")
    if args.markdown:
        print(markdown(rows, args.csv))
        return 0
    measured = {(c["cls"], c["case"]): c for c in comparisons(rows, args.all, "measured", args.csv)}
    per_class = {s["cls"]: s for s in summary(rows, args.csv)}

    def spread(r) -> str:
        return f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})" if r else "-"
    cls = None
    for old in comparisons(rows, args.all, "roofline", args.csv):
        if old["cls"] != cls:
            cls = old["cls"]
            s = per_class[cls]
            print(f"\n{cls} ({s['cases']} cases; ratio median and range: roofline {spread(s['roofline'])}, "
                  f"measured laws {spread(s['measured'])})")
            print(f"  {'case':<40} {'measured':>10} {'roofline':>10} {'ratio':>6} {'laws':>10} {'ratio':>6}")
        new = measured.get((old["cls"], old["case"]))
        laws = f"{new['model_ms']:>10.3f} {new['ratio']:>6.2f}" if new else f"{'-':>10} {'-':>6}"
        print(f"  {old['case']:<40} {old['measured_ms']:>10.3f} {old['model_ms']:>10.3f} {old['ratio']:>6.2f} "
              f"{laws}  {old['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
