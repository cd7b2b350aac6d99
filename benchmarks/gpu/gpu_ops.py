"""Operator timings of the presets' models on one CUDA GPU, as vLLM runs them: one CSV for the cost model's laws.

Random bf16 weights and inputs (nothing is downloaded); shapes and grids from physics/gpu_ops.py (LM_MODELS,
VISION_MODELS, GRIDS). Rows (op column):
- peak.gemm, peak.copy: the ceilings, an 8192³ bf16 matrix product and a 2 GiB device-to-device copy;
- gemm.qkv, gemm.o, gemm.gate_up, gemm.down, gemm.lm_head: each dense GEMM of a layer (torch F.linear, cuBLAS, as
  vLLM's unquantized linear layers), per rank at each TP the presets use, over M = 1..8192 tokens;
- attn.prefill: causal attention of one sequence per layer: impl sdpa-flash (scaled_dot_product_attention, flash
  backend) and flash-varlen (PyTorch's FlashAttention-2 kernel through aten._flash_attention_forward with
  cu_seqlens, as flash_attn_varlen_func; also chunks of new tokens over a longer context, bottom-right causal);
- attn.decode: one query per sequence over its KV context, per layer, B sequences of one context each:
  FlashAttention-2's batched path (split-KV and the GQA packing for one query), KV contiguous per sequence, NOT
  paged (vLLM's paged kernel reads the same bytes through a block table);
- decode_step: a whole decode step of every layer of one rank (embedding, per layer RMSNorm, QKV, rotary, the KV
  write, decode attention, O with the residual, RMSNorm, gate-up, SiLU·mul, down with the residual; final norm,
  lm_head, argmax) captured once in a CUDA graph and replayed, as vLLM runs decode; elementwise ops are torch's
  own kernels, not vLLM's fused ones, and a TP rank's all-reduces are absent (one GPU);
- vision.tower: Qwen2.5-VL's vision tower as vLLM builds it (patch embedding as a linear map, the window
  reordering, 32 blocks with 2-D rotary embeddings, one varlen attention call per block over every window or
  image of the pass with cu_seqlens, the patch merger, the order restored), impl eager (launched from Python as
  vLLM runs the encoder: launch gaps included) or cuda-graph (the GPU's own time); vision.merger alone;
  vision.attn_full and vision.attn_window: one block's varlen attention over the pass.
Timing (METHOD.md of the device machine): CUDA events after warm-up; `inner` calls captured in one CUDA graph so
that a replay lasts about target_ms, weights or KV rotated over copies that together exceed the L2 several times,
`repeats` replays; time_ms is the median per call, time_min_ms and time_max_ms the spread over the replays. flops
and bytes are the work counted per call (bytes: each operand read once, the output written once).

    python3 benchmarks/gpu/gpu_ops.py --out gpu_ops.csv [--quick] [--only peaks,gemm,prefill,decode,step,vision]

The checked-in physics/data/gpu_ops_h200.csv, the source of the cost model's measured operator laws
(physics.oplaws), was made so on an H200 (benchmarks/data/README.md: the exact command, the machine, the log).
`epdbench calibrate --ops CSV --out PROFILE` turns a CSV made on your GPU into a profile that compare and whatif
accept. --quick is a smoke check (under a minute). Needs a CUDA GPU and PyTorch (2.5 or
later; run with 2.11), never runs in CI. One file beside physics/gpu_ops.py, so that a bare GPU machine needs
these two copied and nothing installed.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import math
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

GRID_FILE = Path(__file__).resolve().parents[2] / "physics" / "gpu_ops.py"
_spec = importlib.util.spec_from_file_location("gpu_ops_grid", GRID_FILE)
G = importlib.util.module_from_spec(_spec)
sys.modules["gpu_ops_grid"] = G
_spec.loader.exec_module(G)

DT = torch.bfloat16
DEV = "cuda"
GIB = 2 ** 30


# ---------------------------------------------------------------- timing

class Timer:
    def __init__(self, grid, l2_bytes: int):
        self.grid = grid
        self.rotate_bytes = 4 * l2_bytes

    def copies(self, bytes_per_call: float, most: int = 16) -> int:
        """How many copies of the operands to rotate over so that one pass over them is 4 L2s."""
        return max(1, min(most, math.ceil(self.rotate_bytes / max(1.0, bytes_per_call))))

    def graph(self, call, variants: int = 1) -> list[float]:
        """ms per call of call(i) (i selects the operands' copy i % variants), from CUDA-graph replays."""
        g = self.grid
        for i in range(max(2, variants)):
            call(i % variants)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(variants):
            call(i)
        e1.record()
        e1.synchronize()
        est = max(1e-3, e0.elapsed_time(e1) / variants)
        inner = max(1, min(200, math.ceil(g.target_ms / est)))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(3):
                call(i % variants)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(inner):
                call(i % variants)
        for _ in range(g.warmup):
            graph.replay()
        times = []
        for _ in range(g.repeats):
            e0.record()
            graph.replay()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / inner)
        del graph
        return times

    def eager(self, fn) -> list[float]:
        """ms per call of fn() launched from Python, after warm-up."""
        for _ in range(self.grid.warmup):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(self.grid.repeats):
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        return times


def rnd(*shape, scale: float = 1.0) -> torch.Tensor:
    t = torch.empty(*shape, dtype=DT, device=DEV)
    return t.normal_(0.0, scale)


def flash(q, k, v, cu_q=None, cu_k=None, max_q=0, max_k=0, causal=False):
    """PyTorch's FlashAttention-2 forward: dense [B, L, H, D] when cu_q is None, else varlen [T, H, D]."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False)[0]


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


# ---------------------------------------------------------------- sections

def check_kernels() -> list[str]:
    """The attention kernels against float32 references on fresh random inputs (bf16 lands under 1e-2)."""
    lines = []
    torch.manual_seed(1)
    # causal prefill, GQA, varlen with two sequences
    h, kv, d, lens = 8, 2, 128, (100, 37)
    q, k, v = rnd(sum(lens), h, d), rnd(sum(lens), kv, d), rnd(sum(lens), kv, d)
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device=DEV)
    out = flash(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    refs = []
    for s, e in ((0, lens[0]), (lens[0], sum(lens))):
        qq = q[s:e].float().transpose(0, 1)
        kk = k[s:e].float().repeat_interleave(h // kv, 1).transpose(0, 1)
        vv = v[s:e].float().repeat_interleave(h // kv, 1).transpose(0, 1)
        refs.append(F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).transpose(0, 1))
    lines.append(f"flash-varlen causal GQA: rel err {rel_err(out, torch.cat(refs)):.1e}")
    # decode: one query per sequence over its context
    b, c = 3, 300
    q, k, v = rnd(b, 1, h, d), rnd(b, c, kv, d), rnd(b, c, kv, d)
    out = flash(q, k, v)
    ref = F.scaled_dot_product_attention(q.float().transpose(1, 2),
                                         k.float().repeat_interleave(h // kv, 2).transpose(1, 2),
                                         v.float().repeat_interleave(h // kv, 2).transpose(1, 2)).transpose(1, 2)
    lines.append(f"flash decode batched GQA: rel err {rel_err(out, ref):.1e}")
    # chunked prefill: 64 new tokens after 200, bottom-right causal
    q, k, v = rnd(1, 64, h, d), rnd(1, 264, kv, d), rnd(1, 264, kv, d)
    out = flash(q, k, v, causal=True)
    mask = torch.ones(64, 264, dtype=torch.bool, device=DEV).tril(diagonal=200)
    ref = F.scaled_dot_product_attention(q.float().transpose(1, 2),
                                         k.float().repeat_interleave(h // kv, 2).transpose(1, 2),
                                         v.float().repeat_interleave(h // kv, 2).transpose(1, 2),
                                         attn_mask=mask).transpose(1, 2)
    lines.append(f"flash chunk (bottom-right causal): rel err {rel_err(out, ref):.1e}")
    for line in lines:
        if float(line.rsplit(" ", 1)[1]) > 1e-2 or "nan" in line:
            raise RuntimeError(f"kernel check failed: {line}")
    return lines


def peaks(t: Timer, sink: G.OpsWriter) -> None:
    n = 8192
    a, b = rnd(n, n), rnd(n, n)
    ms = sink.emit("peak.gemm", "torch.matmul bf16", t.graph(lambda i: a @ b), tokens=n,
                   flops=2 * n ** 3, bytes_=3 * 2 * n * n)
    print(f"  peak.gemm {n}³: {2 * n ** 3 / ms / 1e9:.0f} TFLOP/s")
    del a, b
    src = rnd(GIB)                      # 2 GiB of bf16
    dst = torch.empty_like(src)
    for impl, call in (("Tensor.copy_ device to device (a memcpy)", lambda i: dst.copy_(src)),
                       ("torch.neg into a buffer (an elementwise kernel)", lambda i: torch.neg(src, out=dst))):
        ms = sink.emit("peak.copy", impl, t.graph(call), bytes_=2 * src.numel() * 2)
        print(f"  peak.copy 2 GiB, {impl}: {4 * GIB / ms / 1e9:.2f} TB/s (read + write)")


def gemms(t: Timer, sink: G.OpsWriter) -> None:
    for name, shape in G.LM_MODELS.items():
        for tp in G.PRESET_TPS[name]:
            for op, (n, k) in shape.gemms(tp).items():
                copies = t.copies(2 * n * k)
                ws = [rnd(n, k, scale=0.02) for _ in range(copies)]
                bs = [rnd(n, scale=0.02) for _ in range(copies)] if op == "qkv" and shape.qkv_bias else None
                line = []
                for m in t.grid.gemm_tokens:
                    x = rnd(m, k)
                    call = (lambda i: F.linear(x, ws[i], bs[i])) if bs else (lambda i: F.linear(x, ws[i]))
                    ms = sink.emit(f"gemm.{op}", "F.linear (cuBLAS)", t.graph(call, copies), model=name, tp=tp,
                                   tokens=m, flops=2 * m * n * k, bytes_=2 * (m * k + n * k + m * n))
                    line.append(f"{m}:{2 * m * n * k / ms / 1e9:.0f}")
                print(f"  {name} tp{tp} {op} {n}x{k} TFLOP/s by M: {' '.join(line)}")
                del ws, bs


def prefill_attention(t: Timer, sink: G.OpsWriter) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa_ok = True
    for name, shape in G.LM_MODELS.items():
        for tp in G.PRESET_TPS[name]:
            h, kv, d = shape.heads_at(tp), shape.kv_heads_at(tp), shape.head_dim
            cases = [(n, n) for n in t.grid.prefill_tokens] + list(t.grid.chunks)
            for new, ctx in cases:
                per_call = 2 * (new * h + 2 * ctx * kv) * d * 2
                copies = t.copies(per_call, most=8)
                qs = [rnd(1, new, h, d) for _ in range(copies)]
                ks = [rnd(1, ctx, kv, d) for _ in range(copies)]
                vs = [rnd(1, ctx, kv, d) for _ in range(copies)]
                flops = 4 * h * d * new * (ctx - new / 2)
                common = dict(model=name, tp=tp, tokens=new, batch=1, context=ctx, flops=flops, bytes_=per_call)
                cu_q = torch.tensor([0, new], dtype=torch.int32, device=DEV)
                cu_k = torch.tensor([0, ctx], dtype=torch.int32, device=DEV)
                ms = sink.emit("attn.prefill", "flash-varlen (FA2 in PyTorch)", t.graph(
                    lambda i: flash(qs[i][0], ks[i][0], vs[i][0], cu_q, cu_k, new, ctx, causal=True), copies),
                    **common)
                text = f"varlen {flops / ms / 1e9:.0f}"
                if new == ctx:
                    def sdpa(i):
                        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                            return F.scaled_dot_product_attention(
                                qs[i].transpose(1, 2), ks[i].transpose(1, 2), vs[i].transpose(1, 2),
                                is_causal=True, enable_gqa=True)
                    if sdpa_ok:
                        try:
                            times = t.graph(sdpa, copies)
                        except RuntimeError as exc:       # this PyTorch's flash backend refuses GQA: say so once
                            print(f"  sdpa-flash with enable_gqa refused, its rows left out: {exc}".splitlines()[0])
                            sdpa_ok = False
                        else:
                            ms = sink.emit("attn.prefill", "sdpa-flash (enable_gqa)", times, **common)
                            text += f", sdpa {flops / ms / 1e9:.0f}"
                print(f"  {name} tp{tp} prefill {new}/{ctx}: TFLOP/s {text}")
                del qs, ks, vs


def decode_attention(t: Timer, sink: G.OpsWriter) -> None:
    for name, shape in G.LM_MODELS.items():
        for tp in G.PRESET_TPS[name]:
            h, kv, d = shape.heads_at(tp), shape.kv_heads_at(tp), shape.head_dim
            line = []
            for b in t.grid.decode_batches:
                for c in t.grid.decode_contexts:
                    kv_bytes = 2 * b * c * kv * d * 2
                    if kv_bytes > t.grid.decode_kv_gb * 1e9:
                        continue
                    copies = t.copies(kv_bytes, most=8)
                    qs = [rnd(b, 1, h, d) for _ in range(copies)]
                    ks = [rnd(b, c, kv, d) for _ in range(copies)]
                    vs = [rnd(b, c, kv, d) for _ in range(copies)]
                    ms = sink.emit("attn.decode", "flash batched (FA2 in PyTorch), contiguous KV, not paged",
                                   t.graph(lambda i: flash(qs[i], ks[i], vs[i]), copies), model=name, tp=tp,
                                   batch=b, context=c, flops=4 * h * d * b * c,
                                   bytes_=kv_bytes + 2 * 2 * b * h * d)
                    line.append(f"{b}x{c}:{kv_bytes / ms / 1e9:.1f}")
                    del qs, ks, vs
            print(f"  {name} tp{tp} decode attention TB/s by batch x context: {' '.join(line)}")


class DecodeStack:
    """Every layer of one TP rank of a language model, random bf16 weights, a KV pool of `kv_tokens` tokens."""

    def __init__(self, shape, tp: int, kv_tokens: int):
        self.s, self.tp = shape, tp
        self.h, self.kv, self.d = shape.heads_at(tp), shape.kv_heads_at(tp), shape.head_dim
        g = shape.gemms(tp)
        w = 0.02
        self.embed = rnd(g["lm_head"][0], shape.hidden, scale=w)
        self.lm_head = rnd(g["lm_head"][0], shape.hidden, scale=w)
        self.final_norm = torch.ones(shape.hidden, dtype=DT, device=DEV)
        self.layers = []
        for _ in range(shape.layers):
            self.layers.append(dict(
                ln1=torch.ones(shape.hidden, dtype=DT, device=DEV), ln2=torch.ones(shape.hidden, dtype=DT, device=DEV),
                qkv=rnd(*g["qkv"], scale=w), qkv_b=rnd(g["qkv"][0], scale=w) if shape.qkv_bias else None,
                o=rnd(*g["o"], scale=w), gate_up=rnd(*g["gate_up"], scale=w), down=rnd(*g["down"], scale=w),
                qn=torch.ones(self.d, dtype=DT, device=DEV), kn=torch.ones(self.d, dtype=DT, device=DEV)))
        self.cache = rnd(shape.layers, 2, kv_tokens, self.kv, self.d)

    def step(self, ids, cos, sin, b: int, c: int):
        s, h, kv, d = self.s, self.h, self.kv, self.d
        x = F.embedding(ids, self.embed)
        for li, lw in enumerate(self.layers):
            y = F.rms_norm(x, (s.hidden,), lw["ln1"], 1e-6)
            qkv = F.linear(y, lw["qkv"], lw["qkv_b"])
            q, k, v = qkv.split((h * d, kv * d, kv * d), dim=-1)
            q, k, v = q.view(b, h, d), k.view(b, kv, d), v.view(b, kv, d)
            if s.qk_norm:
                q, k = F.rms_norm(q, (d,), lw["qn"], 1e-6), F.rms_norm(k, (d,), lw["kn"], 1e-6)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            kc = self.cache[li, 0, :b * c].view(b, c, kv, d)
            vc = self.cache[li, 1, :b * c].view(b, c, kv, d)
            kc[:, c - 1].copy_(k)
            vc[:, c - 1].copy_(v)
            o = flash(q.view(b, 1, h, d), kc, vc).view(b, h * d)
            x = torch.addmm(x, o, lw["o"].t())
            y = F.rms_norm(x, (s.hidden,), lw["ln2"], 1e-6)
            gate, up = F.linear(y, lw["gate_up"]).chunk(2, dim=-1)
            x = torch.addmm(x, F.silu(gate) * up, lw["down"].t())
        logits = F.linear(F.rms_norm(x, (s.hidden,), self.final_norm, 1e-6), self.lm_head)
        return logits.argmax(dim=-1)


def decode_steps(t: Timer, sink: G.OpsWriter) -> None:
    for name, tp in G.DECODE_STEP_MODELS:
        shape = G.LM_MODELS[name]
        per_token = shape.kv_bytes_per_token(tp)
        cases = [(b, c) for b in t.grid.step_batches for c in t.grid.step_contexts
                 if b * c * per_token <= t.grid.step_kv_gb * 1e9]
        stack = DecodeStack(shape, tp, max(b * c for b, c in cases))
        weight_bytes = 2 * (sum(p.numel() for lw in stack.layers for p in lw.values() if p is not None)
                            + stack.lm_head.numel())
        g = shape.gemms(tp)
        layer_flops = 2 * sum(n * k for op, (n, k) in g.items() if op != "lm_head")
        line = []
        for b, c in cases:
            ids = torch.randint(0, g["lm_head"][0], (b,), device=DEV)
            ang = torch.rand(b, 1, stack.d, device=DEV) * 6.28
            cos, sin = ang.cos().to(DT), ang.sin().to(DT)
            times = t.graph(lambda i: stack.step(ids, cos, sin, b, c))
            flops = b * (shape.layers * layer_flops + 2 * g["lm_head"][0] * shape.hidden) \
                + shape.layers * 4 * stack.h * stack.d * b * c
            ms = sink.emit("decode_step", "cuda-graph replay, all layers, torch elementwise ops (unfused), "
                           "FA2 batched decode, contiguous KV", times, model=name, tp=tp, layers=shape.layers,
                           batch=b, context=c, flops=flops, bytes_=weight_bytes + b * c * per_token)
            line.append(f"{b}x{c}:{ms:.2f}")
        print(f"  {name} tp{tp} decode step ms by batch x context: {' '.join(line)}")
        del stack
        torch.cuda.empty_cache()


class VisionTower:
    """Qwen2.5-VL's vision tower with random bf16 weights, run as vLLM runs it (one varlen call per block)."""

    def __init__(self, v):
        self.v = v
        w, hd, i = 0.02, v.hidden, v.intermediate
        self.embed = rnd(hd, v.patch_pixels, scale=w)
        self.blocks = [dict(n1=torch.ones(hd, dtype=DT, device=DEV), n2=torch.ones(hd, dtype=DT, device=DEV),
                            qkv=rnd(3 * hd, hd, scale=w), qkv_b=rnd(3 * hd, scale=w), proj=rnd(hd, hd, scale=w),
                            proj_b=rnd(hd, scale=w), gate_up=rnd(2 * i, hd, scale=w), gate_up_b=rnd(2 * i, scale=w),
                            down=rnd(hd, i, scale=w), down_b=rnd(hd, scale=w)) for _ in range(v.depth)]
        merged = hd * v.merge ** 2
        self.ln_q = torch.ones(hd, dtype=DT, device=DEV)
        self.m1, self.m1_b = rnd(merged, merged, scale=w), rnd(merged, scale=w)
        self.m2, self.m2_b = rnd(v.out_hidden, merged, scale=w), rnd(v.out_hidden, scale=w)

    def plan(self, image_px: int, images: int) -> dict:
        """The pass's inputs as vLLM's forward has them on the GPU: patches, the window order, cu_seqlens."""
        v, unit = self.v, self.v.merge ** 2
        edge = v.token_edge(image_px)
        tokens = edge * edge
        order, full, window = [], [0], [0]
        win_edge = max(1, v.window_px // v.merge // v.patch)
        for im in range(images):
            base = im * tokens
            for r0 in range(0, edge, win_edge):
                for c0 in range(0, edge, win_edge):
                    cell = [base + r * edge + c for r in range(r0, min(edge, r0 + win_edge))
                            for c in range(c0, min(edge, c0 + win_edge))]
                    order.extend(cell)
                    window.append(window[-1] + len(cell) * unit)
            full.append(full[-1] + tokens * unit)
        order_t = torch.tensor(order, device=DEV)
        patch_order = (order_t[:, None] * unit + torch.arange(unit, device=DEV)).flatten()
        patches = tokens * images * unit
        ang = torch.rand(patches, 1, v.head_dim, device=DEV) * 6.28
        sizes_w = [b - a for a, b in zip(window, window[1:])]
        return dict(x=rnd(patches, v.patch_pixels), patch_order=patch_order, token_restore=torch.argsort(order_t),
                    cos=ang.cos().to(DT), sin=ang.sin().to(DT),
                    cu_full=torch.tensor(full, dtype=torch.int32, device=DEV), max_full=tokens * unit,
                    cu_window=torch.tensor(window, dtype=torch.int32, device=DEV), max_window=max(sizes_w),
                    pairs_full=images * (tokens * unit) ** 2, pairs_window=sum(n * n for n in sizes_w),
                    tokens=tokens * images, patches=patches)

    def attention(self, p: dict, q, k, v, full: bool):
        cu, mx = (p["cu_full"], p["max_full"]) if full else (p["cu_window"], p["max_window"])
        return flash(q, k, v, cu, cu, mx, mx)

    def merger(self, x, p: dict):
        v = self.v
        y = F.rms_norm(x, (v.hidden,), self.ln_q, 1e-6).view(-1, v.hidden * v.merge ** 2)
        return F.linear(F.gelu(F.linear(y, self.m1, self.m1_b)), self.m2, self.m2_b)

    def forward(self, p: dict):
        v, hd, n = self.v, self.v.hidden, p["patches"]
        x = F.linear(p["x"], self.embed).index_select(0, p["patch_order"])
        for bi, bw in enumerate(self.blocks):
            y = F.rms_norm(x, (hd,), bw["n1"], 1e-6)
            q, k, val = F.linear(y, bw["qkv"], bw["qkv_b"]).view(n, 3, v.heads, v.head_dim).unbind(1)
            q, k = rope(q, p["cos"], p["sin"]), rope(k, p["cos"], p["sin"])
            o = self.attention(p, q, k, val, bi in v.fullatt_blocks).reshape(n, hd)
            x = x + F.linear(o, bw["proj"], bw["proj_b"])
            y = F.rms_norm(x, (hd,), bw["n2"], 1e-6)
            gate, up = F.linear(y, bw["gate_up"], bw["gate_up_b"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, bw["down"], bw["down_b"])
        return self.merger(x, p).index_select(0, p["token_restore"])

    def flops(self, p: dict) -> dict:
        v, hd, n = self.v, self.v.hidden, p["patches"]
        merged = hd * v.merge ** 2
        full = len(v.fullatt_blocks)
        attn_full, attn_window = 4 * hd * p["pairs_full"], 4 * hd * p["pairs_window"]
        merger = 2 * p["tokens"] * (merged * merged + merged * v.out_hidden)
        tower = (2 * n * v.patch_pixels * hd + v.depth * 2 * n * (4 * hd * hd + 3 * hd * v.intermediate)
                 + full * attn_full + (v.depth - full) * attn_window + merger)
        return dict(tower=tower, merger=merger, attn_full=attn_full, attn_window=attn_window)


def vision(t: Timer, sink: G.OpsWriter) -> None:
    for name, v in G.VISION_MODELS.items():
        tower = VisionTower(v)
        weights = 2 * (tower.embed.numel() + sum(w.numel() for b in tower.blocks for w in b.values())
                       + tower.m1.numel() + tower.m2.numel())
        check_window_order(tower)
        for px, images in t.grid.images:
            p = tower.plan(px, images)
            fl = tower.flops(p)
            shape = dict(model=name, image_px=px, batch=images, tokens=p["tokens"])
            act = 2 * p["patches"] * v.hidden
            eager = sink.emit("vision.tower", "eager (launched from Python), flash-varlen per block",
                              t.eager(lambda: tower.forward(p)), flops=fl["tower"], bytes_=weights, **shape)
            graph = sink.emit("vision.tower", "cuda-graph, flash-varlen per block",
                              t.graph(lambda i: tower.forward(p)), flops=fl["tower"], bytes_=weights, **shape)
            x = rnd(p["patches"], v.hidden)
            merger = sink.emit("vision.merger", "cuda-graph", t.graph(lambda i: tower.merger(x, p)),
                               flops=fl["merger"], bytes_=act + 2 * (tower.m1.numel() + tower.m2.numel()), **shape)
            copies = t.copies(4 * act, most=8)
            qkv = [rnd(p["patches"], 3, v.heads, v.head_dim).unbind(1) for _ in range(copies)]
            attn = {}
            for full in (True, False):
                attn[full] = sink.emit(f"vision.attn_{'full' if full else 'window'}", "flash-varlen (FA2 in PyTorch)",
                                       t.graph(lambda i: tower.attention(p, *qkv[i], full), copies),
                                       flops=fl["attn_full" if full else "attn_window"], bytes_=4 * act, **shape)
            print(f"  {name} {images}x{px}px ({p['tokens']} tokens): tower eager {eager:.2f} ms, graph {graph:.2f} "
                  f"ms ({fl['tower'] / graph / 1e9:.0f} TFLOP/s); merger {merger:.3f}; attention full "
                  f"{attn[True]:.3f}, window {attn[False]:.3f} ms per block")
            del qkv, x
        del tower
        torch.cuda.empty_cache()


def check_window_order(tower: VisionTower) -> None:
    """The window plan covers every patch once and each window is a contiguous, merge-grouped run."""
    p = tower.plan(336, 2)
    unit = tower.v.merge ** 2
    assert sorted(p["patch_order"].tolist()) == list(range(p["patches"]))
    assert int(p["cu_window"][-1]) == p["patches"] == int(p["cu_full"][-1])
    rows = tower.v.token_edge(336)
    assert [b - a for a, b in zip(p["cu_window"].tolist(), p["cu_window"].tolist()[1:])] == \
        tower.v.windows(rows, rows) * 2
    assert p["patches"] % unit == 0


# ---------------------------------------------------------------- main

def smi(query: str) -> str:
    """nvidia-smi's answer for the first GPU, or "unknown"."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


SECTIONS = {"peaks": peaks, "gemm": gemms, "prefill": prefill_attention, "decode": decode_attention,
            "step": decode_steps, "vision": vision}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="the CSV to write")
    ap.add_argument("--quick", action="store_true", help="a small grid: a smoke check in under a minute")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, of {','.join(SECTIONS)}")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_ops: no CUDA GPU visible to PyTorch: run it on a machine with one", file=sys.stderr)
        return 2
    unknown = [s for s in args.only.split(",") if s not in SECTIONS]
    if unknown:
        print(f"gpu_ops: --only names unknown sections {unknown}: choose from {list(SECTIONS)}", file=sys.stderr)
        return 2
    grid = G.GRIDS["quick" if args.quick else "full"]
    props = torch.cuda.get_device_properties(0)
    meta = dict(gpu=torch.cuda.get_device_name(0), driver=smi("driver_version"), torch=torch.__version__,
                cuda=torch.version.cuda or "", date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"))
    l2 = getattr(props, "L2_cache_size", 50 * 2 ** 20)
    print(f"gpu_ops: {meta} SMs {props.multi_processor_count} L2 {l2 / 2 ** 20:.0f} MiB "
          f"memory {props.total_memory / GIB:.0f} GiB grid {'quick' if args.quick else 'full'}")
    print(f"  flash op: {torch.ops.aten._flash_attention_forward.default._schema}")
    sink, timer, failed = G.OpsWriter(args.out, meta), Timer(grid, l2), []
    start = time.perf_counter()
    with torch.inference_mode():
        try:
            for line in check_kernels():
                print(f"  check: {line}")
        except Exception:                        # timings still come, but the run says it failed
            traceback.print_exc()
            failed.append("check")
        for name in args.only.split(","):
            t0 = time.perf_counter()
            print(f"[{name}]")
            try:
                SECTIONS[name](timer, sink)
            except Exception:                    # one section's failure leaves the others' rows
                traceback.print_exc()
                failed.append(name)
            torch.cuda.empty_cache()
            print(f"[{name}] {time.perf_counter() - t0:.1f} s, {sink.rows} rows so far; SM clock, memory clock, "
                  f"temperature, power: {smi('clocks.sm,clocks.mem,temperature.gpu,power.draw')}")
    sink.file.close()
    print(f"gpu_ops: {sink.rows} rows in {args.out} in {time.perf_counter() - start:.0f} s"
          + (f"; FAILED sections: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
