"""Matched, seeded workloads: the request list of a cell is a pure function of (spec, cell, seed).

Every configuration receives exactly the same prompts and images. Each prompt starts with a
unique nonce so prefix caching cannot inflate results.
"""
from __future__ import annotations

import base64
import hashlib
import io
import random
from dataclasses import dataclass

from sim.costmodel import image_tokens
from specs.models import ExperimentSpec, FixedSuite, MultimodalSuite

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
         "papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud amber "
         "forest signal vector matrix kernel tensor packet socket thread buffer").split()


@dataclass(frozen=True)
class Cell:
    """One measured unit: a workload at a concurrency within a suite (one stream)."""
    suite: str
    kind: str
    workload: str
    concurrency: int
    n_warmup: int
    n_measured: int
    stream: str = "main"

    @property
    def cell_id(self) -> str:
        return f"{self.suite}|{self.workload}|c{self.concurrency}|{self.stream}"

    @property
    def slug(self) -> str:
        w = self.workload.replace("/", "-").replace(":", "-").replace("+", "-")
        return f"{self.suite}_{w}_c{self.concurrency}_{self.stream}"


@dataclass(frozen=True)
class RequestSpec:
    index: int
    phase: str                 # warmup | measured
    api: str                   # completions | chat
    payload: dict              # body without "model", "stream" fields
    target_prompt_tokens: int
    max_tokens: int
    prompt_hash: str
    image_px: int | None = None
    image_hash: str | None = None


def plan_cells(spec: ExperimentSpec) -> list[Cell]:
    cells: list[Cell] = []
    for suite in spec.suites:
        if isinstance(suite, FixedSuite):
            workloads = [s.workload for s in suite.shapes]
        else:
            workloads = [c.workload for c in suite.cells]
        for w in workloads:
            for conc in suite.concurrencies:
                cells.append(Cell(suite.name, suite.kind, w, conc, suite.n_warmup, suite.measured_for(conc)))
    return cells


def _rng(*parts) -> random.Random:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def synth_text(rng: random.Random, n_words: int, nonce: str) -> str:
    """`n_words` whitespace-separated words, the first being a unique nonce."""
    words = [nonce] + [rng.choice(WORDS) for _ in range(max(0, n_words - 1))]
    return " ".join(words[:max(1, n_words)])


def synth_image(rng: random.Random, px: int) -> bytes:
    """A seeded PNG of exactly px × px: a coloured background with random shapes (compresses well)."""
    from PIL import Image, ImageDraw
    img = Image.new("RGB", (px, px), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(16):
        x0, y0 = rng.randrange(px), rng.randrange(px)
        x1, y1 = min(px - 1, x0 + rng.randrange(1, px // 2 + 2)), min(px - 1, y0 + rng.randrange(1, px // 2 + 2))
        fill = tuple(rng.randrange(256) for _ in range(3))
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)([x0, y0, x1, y1], fill=fill)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def _hash(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
    return h.hexdigest()[:16]


def build_requests(spec: ExperimentSpec, cell: Cell, trial: int = 0, seed: int | None = None) -> list[RequestSpec]:
    """Warm-up then measured requests of a cell. Trial-independent: every trial replays the same list."""
    seed = spec.seed if seed is None else seed
    suite = next(s for s in spec.suites if s.name == cell.suite)
    total = cell.n_warmup + cell.n_measured
    out: list[RequestSpec] = []
    image_cache: dict[int, tuple[bytes, str]] = {}
    for i in range(total):
        phase = "warmup" if i < cell.n_warmup else "measured"
        rng = _rng(seed, cell.suite, cell.workload, cell.concurrency, cell.stream, i)
        nonce = f"req{_hash(str(seed), cell.cell_id, str(i))}"
        if isinstance(suite, FixedSuite):
            shape = next(s for s in suite.shapes if s.workload == cell.workload)
            prompt = synth_text(rng, shape.input_tokens, nonce)
            payload = {"prompt": prompt, "max_tokens": shape.output_tokens, "ignore_eos": True}
            out.append(RequestSpec(i, phase, "completions", payload, shape.input_tokens, shape.output_tokens,
                                   _hash(prompt)))
            continue
        assert isinstance(suite, MultimodalSuite)
        mm = next(c for c in suite.cells if c.workload == cell.workload)
        key = 0 if suite.reuse_image else i
        if key not in image_cache:
            img_rng = _rng(seed, cell.suite, cell.workload, "image", key if not suite.reuse_image else "shared")
            data = synth_image(img_rng, mm.image_px)
            image_cache[key] = (data, _hash(data))
        data, ihash = image_cache[key]
        text = synth_text(rng, mm.text_tokens, nonce)
        url = "data:image/png;base64," + base64.b64encode(data).decode()
        payload = {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}],
            "max_tokens": mm.output_tokens, "ignore_eos": True}
        target = mm.text_tokens + spec.model.chat_overhead_tokens + image_tokens(spec.model, mm.image_px, mm.image_px)
        out.append(RequestSpec(i, phase, "chat", payload, target, mm.output_tokens, _hash(text, ihash),
                               mm.image_px, ihash))
    return out


def prompt_set_hash(requests: list[RequestSpec]) -> str:
    return _hash(*[r.prompt_hash for r in requests])
