"""What an API server's CPU spends on one image before the request reaches the engine, and its fit in pixels.

For each format and edge, times the path vLLM's OpenAI server takes for an image sent as a base64 data URL:
- decode: base64, PIL open and load, convert to RGB (vllm/multimodal/image.py ImageMediaIO);
- hash: the RGBA pixels hashed for the multimodal caches (vllm/multimodal/hasher.py MultiModalHasher, blake3;
  sha256 stands in when the blake3 package is not installed);
- process: Qwen2-VL's image processor as transformers' slow (numpy) Qwen2VLImageProcessor does it —
  smart_resize to multiples of 28 px within min/max_pixels, bicubic resize (PIL, a copy when the size already
  fits), float32, rescale by 1/255, normalise with the OpenAI CLIP mean/std, channels first, the frame
  repeated to the temporal patch (2) and patchified to (patches, 3·2·14·14).
(vLLM loads the fast, torch-based processor by default; the numpy one stands for it here.) The images are the
load generator's own (specs/workload.py synth_image). Prints the table (ms per stage in the fastest repeat,
and the median total) and the fit ms = a + b · megapixels (least squares on relative errors) per format and
over both: the figures of `hardware.image_preprocess_ms` and `hardware.image_preprocess_ms_per_mp`; and that of
decode and hash alone, what an image found in vLLM's multimodal processor cache still costs
(`hardware.image_decode_ms_per_mp`).

    python benchmarks/serving/image_preprocess.py [--edges 224,560,1120,1680,2240] [--formats png,jpeg] [--seconds 1.0]
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import math
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from epdbench.specs.workload import synth_image  # noqa: E402

try:                                   # what vLLM hashes with; not a dependency of epdbench
    from blake3 import blake3 as _hasher
    HASHER = "blake3"
except ImportError:
    _hasher = hashlib.sha256
    HASHER = "sha256 (blake3 not installed)"

# Qwen2.5-VL preprocessor_config.json and transformers' image_utils (OPENAI_CLIP_MEAN / OPENAI_CLIP_STD)
PATCH, MERGE, TEMPORAL = 14, 2, 2
MIN_PIXELS, MAX_PIXELS = 3136, 12_845_056
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def smart_resize(height: int, width: int, factor: int = PATCH * MERGE) -> tuple[int, int]:
    """transformers' Qwen2-VL smart_resize: both edges multiples of `factor`, pixels within min/max_pixels."""
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > MAX_PIXELS:
        beta = (height * width / MAX_PIXELS) ** 0.5
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < MIN_PIXELS:
        beta = (MIN_PIXELS / (height * width)) ** 0.5
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def decode(data_url_payload: str) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(data_url_payload)))
    image.load()
    return image.convert("RGB")


def hash_pixels(image: Image.Image) -> str:
    return _hasher(np.asarray(image.convert("RGBA")).tobytes()).hexdigest()


def process(image: Image.Image) -> np.ndarray:
    """pixel_values of one image, (patches, 3 · temporal · patch²) float32."""
    h, w = smart_resize(image.height, image.width)
    resized = image.resize((w, h), Image.Resampling.BICUBIC)
    x = np.asarray(resized, dtype=np.float32) * np.float32(1 / 255)
    x = ((x - CLIP_MEAN) / CLIP_STD).transpose(2, 0, 1)                  # channels first
    frames = np.broadcast_to(x, (TEMPORAL, *x.shape))                    # one frame fills the temporal patch
    gh, gw = h // PATCH, w // PATCH
    patches = frames.reshape(1, TEMPORAL, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    return np.ascontiguousarray(patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)).reshape(gh * gw, -1)


def time_stages(payload: str, seconds: float, min_repeats: int = 5) -> dict[str, float]:
    """ms of each stage and of their sum in the fastest of the repeats filling about `seconds` (timeit's rule:
    the least disturbed run estimates the cost; other work on the host only adds to it)."""
    runs: list[tuple[float, float, float]] = []
    started = time.perf_counter()
    while len(runs) < min_repeats or time.perf_counter() - started < seconds:
        t0 = time.perf_counter()
        image = decode(payload)
        t1 = time.perf_counter()
        hash_pixels(image)
        t2 = time.perf_counter()
        process(image)
        t3 = time.perf_counter()
        runs.append((t1 - t0, t2 - t1, t3 - t2))
    best = min(runs, key=sum)
    median = statistics.median(sum(r) for r in runs)
    return {"decode_ms": best[0] * 1e3, "hash_ms": best[1] * 1e3, "process_ms": best[2] * 1e3,
            "total_ms": sum(best) * 1e3, "median_ms": median * 1e3, "repeats": len(runs)}


def fit_line(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """y = a + b·x, a ≥ 0, by least squares on relative errors (the sizes span two orders of magnitude: an absolute
    fit would serve the largest image and leave small ones off by their whole cost): (a, b, worst relative error)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    b, a = np.polyfit(xs, ys, 1, w=1 / ys)
    if a < 0:                          # through the origin instead: min Σ((b·x − y)/y)²
        a, b = 0.0, float(np.sum(xs / ys) / np.sum((xs / ys) ** 2))
    return float(a), float(b), float(np.max(np.abs(a + b * xs - ys) / ys))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", default="224,560,1120,1680,2240", help="square image edges in px, comma-separated")
    ap.add_argument("--formats", default="png,jpeg")
    ap.add_argument("--seconds", type=float, default=1.0, help="time spent on each cell (at least 5 repeats)")
    args = ap.parse_args()
    edges = [int(e) for e in args.edges.split(",")]
    formats = args.formats.split(",")
    print(f"CPU: {cpu_name()}; Python {platform.python_version()}, Pillow {Image.__version__}, "
          f"numpy {np.__version__}; hash: {HASHER}; one thread")
    print(f"{'format':6} {'edge':>5} {'Mpx':>6} {'bytes':>9} {'decode':>8} {'hash':>7} {'process':>8} "
          f"{'total ms':>9} {'median':>8} {'runs':>5}")
    points: dict[str, list[tuple[float, float, float]]] = {f: [] for f in formats}   # (Mpx, total, decode+hash)
    for fmt in formats:
        for edge in edges:
            data = synth_image(random.Random(edge), edge, fmt)
            stages = time_stages(base64.b64encode(data).decode(), args.seconds)
            mpx = edge * edge / 1e6
            points[fmt].append((mpx, stages["total_ms"], stages["decode_ms"] + stages["hash_ms"]))
            print(f"{fmt:6} {edge:5d} {mpx:6.3f} {len(data):9d} {stages['decode_ms']:8.2f} "
                  f"{stages['hash_ms']:7.2f} {stages['process_ms']:8.2f} {stages['total_ms']:9.2f} "
                  f"{stages['median_ms']:8.2f} {stages['repeats']:5d}")
    fits = dict(points)
    if len(formats) > 1:
        fits["all"] = [p for pts in points.values() for p in pts]
    for what, col in (("total", 1), ("decode + hash (a processor-cache hit)", 2)):
        print(f"{what}:")
        for name, pts in fits.items():
            a, b, err = fit_line([p[0] for p in pts], [p[col] for p in pts])
            print(f"  fit {name:5}: ms = {a:.2f} + {b:.2f} · Mpx   (worst cell off by {err:.0%})")


if __name__ == "__main__":
    main()
