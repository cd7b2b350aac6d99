"""Operator timings measured on a GPU by benchmarks/gpu/gpu_ops.py (and TP all-reduces across GPUs by
benchmarks/gpu/gpu_allreduce.py): the shapes they measure and the CSV they write.

The language models' layer shapes and the vision tower's are those of the presets' models (Hugging Face config.json
of Qwen/Qwen3-32B and Qwen/Qwen2.5-VL-7B-Instruct; a test checks them against the presets' ModelSpec); the grids
say which token counts, lengths, batches, contexts and images are timed. `read_ops_csv` reads a measured CSV back,
strictly: a bad cell is one error line naming the row, the column and the fix.

Standard library only: the benchmarks load this file by its path on a GPU machine where epdbench is not
installed.
"""
from __future__ import annotations

import csv
import datetime
import io
import math
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LmShape:
    """One decoder-only language model's layer as vLLM shards it over TP (QKVParallelLinear, RowParallelLinear,
    MergedColumnParallelLinear, VocabParallelEmbedding)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qkv_bias: bool
    qk_norm: bool

    def heads_at(self, tp: int) -> int:
        return self.heads // tp

    def kv_heads_at(self, tp: int) -> int:
        """KV heads on each rank: split over TP, or replicated once TP exceeds them."""
        return max(1, self.kv_heads // tp)

    def gemms(self, tp: int) -> dict[str, tuple[int, int]]:
        """Each dense GEMM of one rank as (output features n, input features k): y[M, n] = x[M, k] · Wᵀ."""
        q = self.heads_at(tp) * self.head_dim
        kv = self.kv_heads_at(tp) * self.head_dim
        ffn = self.intermediate // tp
        return {"qkv": (q + 2 * kv, self.hidden), "o": (self.hidden, q), "gate_up": (2 * ffn, self.hidden),
                "down": (self.hidden, ffn), "lm_head": (-(-self.vocab // tp), self.hidden)}

    def kv_bytes_per_token(self, tp: int, dtype_bytes: int = 2) -> int:
        """KV bytes of one token on one rank, all layers."""
        return 2 * self.layers * self.kv_heads_at(tp) * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class VisionShape:
    """Qwen2.5-VL's vision tower (config.json vision_config; vLLM qwen2_5_vl.py Qwen2_5_VisionTransformer)."""
    depth: int = 32
    hidden: int = 1280
    heads: int = 16
    intermediate: int = 3420
    patch: int = 14
    temporal_patch: int = 2
    merge: int = 2
    window_px: int = 112
    fullatt_blocks: tuple[int, ...] = (7, 15, 23, 31)
    out_hidden: int = 3584
    in_channels: int = 3

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def patch_pixels(self) -> int:
        return self.in_channels * self.temporal_patch * self.patch ** 2

    def token_edge(self, image_px: int) -> int:
        """LM tokens along one edge of a square image, resized to a multiple of patch · merge px."""
        return max(1, round(image_px / (self.patch * self.merge)))

    def windows(self, rows: int, cols: int) -> list[int]:
        """Patches in each attention window of one image of rows × cols LM tokens, in vLLM's order
        (get_window_index: windows of window_px tile the token grid row by row from its corner, the last row and
        column of windows cut short; each LM token is merge² patches, kept together)."""
        edge = max(1, self.window_px // self.merge // self.patch)
        return [min(edge, rows - r) * min(edge, cols - c) * self.merge ** 2
                for r in range(0, rows, edge) for c in range(0, cols, edge)]


# Hugging Face config.json figures (num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
# head_dim, intermediate_size, vocab_size; Qwen2 attention has a QKV bias, Qwen3 an RMSNorm on q and k instead).
LM_MODELS: dict[str, LmShape] = {
    "Qwen/Qwen3-32B": LmShape(layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600,
                              vocab=151936, qkv_bias=False, qk_norm=True),
    "Qwen/Qwen2.5-VL-7B-Instruct": LmShape(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
                                           intermediate=18944, vocab=152064, qkv_bias=True, qk_norm=False),
}
VISION_MODELS: dict[str, VisionShape] = {"Qwen/Qwen2.5-VL-7B-Instruct": VisionShape()}
# The TP sizes measured for each model: every TP its presets' roles use (specs/*.yaml), and TP 1, the unsharded
# layer; a GEMM or attention at TP > 1 is one rank's.
PRESET_TPS: dict[str, tuple[int, ...]] = {"Qwen/Qwen3-32B": (1, 2), "Qwen/Qwen2.5-VL-7B-Instruct": (1,)}
# The decode steps timed whole (all layers, one rank): the presets' decode engines.
DECODE_STEP_MODELS: tuple[tuple[str, int], ...] = (("Qwen/Qwen2.5-VL-7B-Instruct", 1), ("Qwen/Qwen3-32B", 2))


@dataclass(frozen=True)
class Grid:
    gemm_tokens: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]           # (new tokens, whole context) of a chunked prefill
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_kv_gb: float                           # one layer's KV held for decode attention, at most
    step_batches: tuple[int, ...]
    step_contexts: tuple[int, ...]
    step_kv_gb: float                             # the whole stack's KV held for a decode step, at most
    images: tuple[tuple[int, int], ...]           # (edge px of a square image, images in one pass)
    repeats: int
    warmup: int
    target_ms: float                              # a timed graph replay lasts about this long


GRIDS: dict[str, Grid] = {
    "full": Grid(
        gemm_tokens=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
                     4096, 6144, 8192),
        prefill_tokens=(128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
        chunks=((512, 4096), (512, 16384), (2048, 8192), (2048, 32768)),
        decode_batches=(1, 8, 32, 64, 128, 256), decode_contexts=(512, 2048, 8192, 32768), decode_kv_gb=24.0,
        step_batches=(1, 8, 32, 64, 128, 256), step_contexts=(512, 2048, 8192, 32768), step_kv_gb=64.0,
        images=((112, 1), (224, 1), (336, 1), (448, 1), (560, 1), (672, 1), (840, 1), (1008, 1), (1260, 1),
                (1512, 1), (1792, 1), (2240, 1), (224, 4), (560, 4), (1260, 4), (560, 8)),
        repeats=15, warmup=3, target_ms=2.0),
    "quick": Grid(
        gemm_tokens=(1, 64, 2048), prefill_tokens=(512, 4096), chunks=((512, 4096),),
        decode_batches=(1, 64), decode_contexts=(2048,), decode_kv_gb=4.0,
        step_batches=(1, 32), step_contexts=(2048,), step_kv_gb=16.0,
        images=((224, 1), (1260, 1), (224, 4)), repeats=5, warmup=2, target_ms=0.5),
}

@dataclass(frozen=True)
class AllReduceGrid:
    """What benchmarks/gpu/gpu_allreduce.py times: one TP all-reduce of tokens × hidden bf16 activations (vLLM's
    RowParallelLinear output, two per layer) for every LM_MODELS hidden size and each token count."""
    tokens: tuple[int, ...]
    repeats: int
    warmup: int
    target_ms: float                              # a timed replay (or eager loop) lasts about this long


# Token counts: decode batches up to the presets' max_num_seqs (256) and prefill steps up to their
# max_num_batched_tokens (8192), one beyond for the link's bandwidth.
ALLREDUCE_GRIDS: dict[str, AllReduceGrid] = {
    "full": AllReduceGrid(tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
                          repeats=15, warmup=3, target_ms=2.0),
    "quick": AllReduceGrid(tokens=(1, 64, 2048), repeats=5, warmup=2, target_ms=0.5),
}
# The TP sizes an all-reduce is timed at, those the host's GPUs allow (vLLM's TP divides the heads: powers of 2).
ALLREDUCE_TPS = (2, 4, 8)

# op → the shape columns its rows must fill (positive integers); the rest may be empty.
OPS: dict[str, tuple[str, ...]] = {
    "peak.gemm": ("tokens",),
    "peak.copy": (),
    **{f"gemm.{name}": ("tp", "tokens") for name in ("qkv", "o", "gate_up", "down", "lm_head")},
    "attn.prefill": ("tp", "tokens", "batch", "context"),
    "attn.decode": ("tp", "batch", "context"),
    "decode_step": ("tp", "layers", "batch", "context"),
    "vision.tower": ("image_px", "batch", "tokens"),
    "vision.merger": ("image_px", "batch", "tokens"),
    "vision.attn_full": ("image_px", "batch", "tokens"),
    "vision.attn_window": ("image_px", "batch", "tokens"),
    "allreduce": ("tp", "tokens"),                # benchmarks/gpu/gpu_allreduce.py: bytes = tokens × hidden × 2
}
META_COLUMNS = ("gpu", "driver", "torch", "cuda", "date")
SHAPE_COLUMNS = ("tp", "layers", "tokens", "batch", "context", "image_px")
COLUMNS = (*META_COLUMNS, "op", "impl", "model", *SHAPE_COLUMNS, "flops", "bytes",
           "time_ms", "time_min_ms", "time_max_ms", "repeats")


def op_row(meta: dict, op: str, impl: str, times_ms: list[float], *, model: str = "", flops: float = 0,
           bytes_: float = 0, **shape) -> dict:
    """The CSV row (COLUMNS) of an operator timed once per repeat (`times_ms`, ms per call): the median as time_ms,
    the spread as time_min_ms and time_max_ms; shape columns not given are empty. What the benchmark scripts
    write (benchmarks/gpu/gpu_ops.py, gpu_allreduce.py) and parse_ops_csv reads."""
    if not times_ms:
        raise ValueError(f"{op}: no timings")
    return {**meta, "op": op, "impl": impl, "model": model, **{c: "" for c in SHAPE_COLUMNS}, **shape,
            "flops": round(flops), "bytes": round(bytes_), "time_ms": f"{statistics.median(times_ms):.5g}",
            "time_min_ms": f"{min(times_ms):.5g}", "time_max_ms": f"{max(times_ms):.5g}", "repeats": len(times_ms)}


class OpsWriter:
    """Writes op_row rows to a CSV as they are measured, flushing each (a run cut short keeps what it measured)."""

    def __init__(self, path: Path, meta: dict):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("w", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=COLUMNS)
        self.writer.writeheader()
        self.meta = meta
        self.rows = 0

    def emit(self, op: str, impl: str, times_ms: list[float], **columns) -> float:
        """Write the row; returns its median time (ms)."""
        self.writer.writerow(op_row(self.meta, op, impl, times_ms, **columns))
        self.file.flush()
        self.rows += 1
        return statistics.median(times_ms)


class GpuOpsError(ValueError):
    """A gpu_ops CSV that cannot be used: its message is one line naming the row, the column and the fix."""


@dataclass(frozen=True)
class OpRow:
    gpu: str
    driver: str
    torch: str
    cuda: str
    date: datetime.datetime
    op: str
    impl: str
    model: str
    tp: int | None
    layers: int | None
    tokens: int | None
    batch: int | None
    context: int | None
    image_px: int | None
    flops: float
    bytes: float
    time_ms: float
    time_min_ms: float
    time_max_ms: float
    repeats: int


def _count(cell: str, where: str, required: bool) -> int | None:
    if cell == "":
        if required:
            raise GpuOpsError(f"{where}: empty, but this op needs it: a positive integer")
        return None
    try:
        value = int(cell)
    except ValueError:
        raise GpuOpsError(f"{where}: {cell!r} is not an integer: write a whole number") from None
    if value <= 0:
        raise GpuOpsError(f"{where}: {value} must be positive")
    return value


def _number(cell: str, where: str, positive: bool) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise GpuOpsError(f"{where}: {cell!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise GpuOpsError(f"{where}: {cell} must be a finite number {'> 0' if positive else '>= 0'}")
    return value


def _row(cells: dict[str, str], where: str) -> OpRow:
    for col in ("gpu", "driver", "torch", "op", "impl"):
        if not cells[col].strip():
            raise GpuOpsError(f"{where}, column {col}: empty: write what the run used")
    op = cells["op"]
    if op not in OPS:
        raise GpuOpsError(f"{where}, column op: unknown op {op!r}: one of {', '.join(OPS)}")
    needs = OPS[op]
    if not op.startswith("peak.") and not cells["model"].strip():
        raise GpuOpsError(f"{where}, column model: empty: name the model whose shapes were timed")
    try:
        date = datetime.datetime.fromisoformat(cells["date"])
    except ValueError:
        raise GpuOpsError(f"{where}, column date: {cells['date']!r} is not an ISO 8601 date") from None
    shape = {col: _count(cells[col], f"{where}, column {col}", col in needs) for col in SHAPE_COLUMNS}
    times = {col: _number(cells[col], f"{where}, column {col}", True)
             for col in ("time_ms", "time_min_ms", "time_max_ms")}
    if not times["time_min_ms"] <= times["time_ms"] <= times["time_max_ms"]:
        raise GpuOpsError(f"{where}, column time_ms: {times['time_ms']} lies outside its spread "
                          f"[{times['time_min_ms']}, {times['time_max_ms']}]: the median lies within min and max")
    repeats = _count(cells["repeats"], f"{where}, column repeats", True)
    return OpRow(gpu=cells["gpu"], driver=cells["driver"], torch=cells["torch"], cuda=cells["cuda"], date=date,
                 op=op, impl=cells["impl"], model=cells["model"], **shape,
                 flops=_number(cells["flops"], f"{where}, column flops", False),
                 bytes=_number(cells["bytes"], f"{where}, column bytes", False), **times, repeats=repeats)


def parse_ops_csv(text: str, source: str = "gpu_ops CSV") -> list[OpRow]:
    """The rows of a gpu_ops CSV; GpuOpsError (one line: the source, the row as numbered in the file, the column
    and the fix) on any cell that cannot be used. The header must hold exactly COLUMNS, in any order."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in COLUMNS if c not in header]
    unknown = [c for c in header if c not in COLUMNS]
    if missing or unknown:
        raise GpuOpsError(f"{source}, header: " + "; ".join(
            part for part in (f"missing {', '.join(missing)}" if missing else "",
                              f"unknown {', '.join(unknown)}" if unknown else "") if part)
            + ": write benchmarks/gpu/gpu_ops.py's columns")
    rows = []
    for line, cells in enumerate(reader, start=2):
        if None in cells or any(v is None for v in cells.values()):
            raise GpuOpsError(f"{source}, row {line}: {len(header)} cells expected: one per column of the header")
        rows.append(_row(cells, f"{source}, row {line}"))
    if not rows:
        raise GpuOpsError(f"{source}: no rows: run benchmarks/gpu/gpu_ops.py to measure some")
    return rows


def read_ops_csv(path: str | Path) -> list[OpRow]:
    """parse_ops_csv of a file; a missing or unreadable file is a GpuOpsError too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GpuOpsError(f"{path}: cannot be read ({exc.__class__.__name__}): give a gpu_ops CSV") from None
    return parse_ops_csv(text, str(path))
