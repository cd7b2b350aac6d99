"""Matched, seeded workloads: the request list of a cell is a pure function of (spec, cell, seed,
calibration).

Every configuration receives exactly the same prompts and images. Each prompt's text starts with a
unique nonce, and no image is sent in two cells (images come before the text in a chat prompt, so a
shared image would be a shared prefix), so neither the prefix cache nor the encoder cache can inflate
results, except where a suite reuses one image within a cell on purpose.
Prompt lengths are hit through a calibration measured once per run against the endpoint's own
/tokenize (see tasks/load/calibrate.py); without one, one word counts as one token.
"""
from __future__ import annotations

import base64
import hashlib
import io
import random
import re
import struct
import zlib
from dataclasses import dataclass, field, replace
from functools import lru_cache

from epdbench.physics.costmodel import image_tokens
from epdbench.specs.models import ExperimentSpec, FixedSuite, MixedSuite, MultimodalSuite, RateSuite, StreamSpec
from epdbench.specs.tracing import traced_indices

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
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
    arrival: str = "closed"            # closed | burst | poisson | constant
    burst_size: int = 1
    burst_interval_s: float = 0.0
    rate: float | None = None          # offered requests/s (open-loop poisson | constant)
    first_wave_spread_s: float = 0.0   # closed loop: the first wave's sends spread over this (seeded)

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
    offset_s: float | None = None   # scheduled send time from the start of the phase (open loop, bursts, and
                                    # the first wave of a closed loop); None: as soon as a worker is free
    traced: bool = False            # the load generator opens a span and sends a traceparent (spec.tracing)


@dataclass(frozen=True)
class Calibration:
    """Prompt tokens = tokens_per_word × words + overhead_tokens, per (api, image edge)."""
    fits: dict[str, tuple[float, float]] = field(default_factory=dict)

    @staticmethod
    def key(api: str, image_px: int | None) -> str:
        return f"{api}:{image_px or 0}"

    def words_for(self, api: str, image_px: int | None, target_tokens: int, default_overhead: int) -> int:
        slope, overhead = self.fits.get(self.key(api, image_px), (1.0, float(default_overhead)))
        return max(1, round((target_tokens - overhead) / slope))


def plan_cells(spec: ExperimentSpec) -> list[Cell]:
    cells: list[Cell] = []
    for suite in spec.suites:
        if isinstance(suite, MixedSuite):
            for st in suite.streams:
                cells.append(Cell(suite.name, suite.kind, st.workload, st.concurrency, suite.n_warmup,
                                  st.n_requests, st.name, st.arrival,
                                  st.burst_size if st.arrival == "burst" else 1,
                                  st.burst_interval_s if st.arrival == "burst" else 0.0))
            continue
        if isinstance(suite, RateSuite):
            for shape in suite.shapes:
                for rate in suite.rates:
                    cells.append(Cell(suite.name, suite.kind, rate_workload(shape.workload, rate), suite.max_in_flight,
                                      suite.n_warmup, suite.n_measured, arrival=suite.arrival, rate=rate))
            continue
        workloads = ([s.workload for s in suite.shapes] if isinstance(suite, FixedSuite)
                     else [c.workload for c in suite.cells])
        for w in workloads:
            for conc in suite.concurrencies:
                cells.append(Cell(suite.name, suite.kind, w, conc, suite.warmup_for(conc), suite.measured_for(conc),
                                  first_wave_spread_s=suite.first_wave_spread_s))
    return cells


def rate_workload(shape: str, rate: float) -> str:
    """A rate cell's workload: its shape at its offered rate, e.g. 1024/128@4/s."""
    return f"{shape}@{rate:g}/s"


_RATE_SUFFIX = re.compile(r"(.+)@(\d+(?:\.\d*)?(?:e[+-]?\d+)?)/s")


def split_rate(workload: str) -> tuple[str, float | None]:
    """(shape, offered rate) of a workload label, the inverse of rate_workload: 1024/128@4/s → (1024/128, 4.0);
    a closed-loop workload → (itself, None). What the summary and records keep of a rate cell is its label."""
    m = _RATE_SUFFIX.fullmatch(str(workload))
    return (m.group(1), float(m.group(2))) if m else (str(workload), None)


def arrival_offsets(cell: Cell, seed: int, trial: int) -> list[float | None]:
    """Scheduled send offsets (s from the phase start) of a cell's measured requests, seeded: open-loop
    arrivals at the cell's rate, bursts, or (closed loop) the first wave spread at random and the rest None."""
    n = cell.n_measured
    if cell.arrival == "burst":
        return [(i // cell.burst_size) * cell.burst_interval_s for i in range(n)]
    rng = _rng(seed, cell.cell_id, trial, "arrivals")
    if cell.arrival == "constant":
        return [i / cell.rate for i in range(n)]
    if cell.arrival == "poisson":
        t, out = 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(cell.rate)
        return out
    first = min(cell.concurrency, n) if cell.first_wave_spread_s > 0 else 0
    return sorted(rng.uniform(0, cell.first_wave_spread_s) for _ in range(first)) + [None] * (n - first)


def _rng(*parts) -> random.Random:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def synth_text(rng: random.Random, n_words: int, nonce: str) -> str:
    """`n_words` whitespace-separated words, the first being a unique nonce. The words are those
    `rng.choice(WORDS)` draws one by one (CPython's rejection sampling over getrandbits, inlined: the same
    words, several times faster for long prompts)."""
    n, k, bits = len(WORDS), len(WORDS).bit_length(), rng.getrandbits
    words = [nonce]
    for _ in range(max(0, n_words - 1)):
        r = bits(k)
        while r >= n:
            r = bits(k)
        words.append(WORDS[r])
    return " ".join(words[:max(1, n_words)])


def synth_image(rng: random.Random, px: int, fmt: str = "png") -> bytes:
    """A seeded image of exactly px × px: a coloured background with random shapes."""
    from PIL import Image, ImageDraw
    img = Image.new("RGB", (px, px), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(16):
        x0, y0 = rng.randrange(px), rng.randrange(px)
        x1, y1 = min(px - 1, x0 + rng.randrange(1, px // 2 + 2)), min(px - 1, y0 + rng.randrange(1, px // 2 + 2))
        fill = tuple(rng.randrange(256) for _ in range(3))
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)([x0, y0, x1, y1], fill=fill)
    buf = io.BytesIO()
    img.save(buf, format="PNG" if fmt == "png" else "JPEG", **({"quality": 90} if fmt == "jpeg" else {}))
    return buf.getvalue()


def stand_in_image(rng: random.Random, px: int) -> bytes:
    """A valid px × px PNG, one colour, whose bytes are unique to `rng` (a text chunk with 128 of its bits): all
    the simulator reads of an image is its size and, for its caches, its hash (sim.tokenizer), so a run in
    virtual time needs no drawn image. Microseconds where synth_image takes tens of milliseconds at 1792 px."""
    head, body = _blank_png(px)
    return head + _png_chunk(b"tEXt", b"epdbench\0" + f"{rng.getrandbits(128):032x}".encode()) + body


@lru_cache(maxsize=16)
def _blank_png(px: int) -> tuple[bytes, bytes]:
    """(signature and IHDR, IDAT and IEND) of a black px × px 8-bit RGB PNG."""
    ihdr = struct.pack(">IIBBBBB", px, px, 8, 2, 0, 0, 0)
    rows = zlib.compress(bytes((3 * px + 1) * px))      # filter byte 0 and three zero bytes per pixel, per row
    return (PNG_SIGNATURE + _png_chunk(b"IHDR", ihdr),
            _png_chunk(b"IDAT", rows) + _png_chunk(b"IEND", b""))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _hash(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class _Shape:
    """What one request of a cell asks for, before synthesis."""
    text_tokens: int | None        # target tokens of the text part (chat) ...
    prompt_tokens: int | None      # ... or of the whole prompt (completions)
    output_tokens: int
    image_px: int | None
    reuse_image: bool
    image_format: str


def _shape_for(spec: ExperimentSpec, cell: Cell, rng: random.Random) -> _Shape:
    suite = next(s for s in spec.suites if s.name == cell.suite)
    if isinstance(suite, (FixedSuite, RateSuite)):
        shape = next(s for s in suite.shapes if cell.workload in (s.workload, rate_workload(s.workload, cell.rate or 0)))
        if shape.image_px:
            return _Shape(shape.input_tokens, None, shape.output_tokens, shape.image_px, False, "png")
        return _Shape(None, shape.input_tokens, shape.output_tokens, None, False, "png")
    if isinstance(suite, MultimodalSuite):
        mm = next(c for c in suite.cells if c.workload == cell.workload)
        return _Shape(mm.text_tokens, None, mm.output_tokens, mm.image_px, suite.reuse_image, suite.image_format)
    st: StreamSpec = next(s for s in suite.streams if s.name == cell.stream)
    n = st.input_tokens if st.input_tokens is not None else rng.randint(st.input_tokens_min, st.input_tokens_max)
    if st.image_px:
        return _Shape(n, None, st.output_tokens, st.image_px, False, "png")
    return _Shape(None, n, st.output_tokens, None, False, "png")


def build_requests(spec: ExperimentSpec, cell: Cell, trial: int = 0, seed: int | None = None,
                   calibration: Calibration | None = None, stand_in_images: bool = False) -> list[RequestSpec]:
    """Warm-up then measured requests of a cell. Every trial replays the same shapes and words, but with
    fresh nonces and images, so a trial never hits the prefix or encoder cache filled by the one before.
    `stand_in_images`: each image a stand_in_image of the same size from the same seed (PNG) instead of the
    drawn one — for the virtual-time simulator, which reads only sizes and identities; the texts are the same,
    the image and prompt hashes are not those of a run."""
    seed = spec.seed if seed is None else seed
    cal = calibration or Calibration()
    out: list[RequestSpec] = []
    images: dict[object, tuple[bytes, str]] = {}
    chat_overhead = spec.model.chat_overhead_tokens
    offsets = arrival_offsets(cell, seed, trial)
    for i in range(cell.n_warmup + cell.n_measured):
        phase = "warmup" if i < cell.n_warmup else "measured"
        rng = _rng(seed, cell.suite, cell.workload, cell.concurrency, cell.stream, i)
        shape = _shape_for(spec, cell, rng)
        nonce = f"req{_hash(str(seed), cell.cell_id, str(i), str(trial))}"
        offset_s = offsets[i - cell.n_warmup] if phase == "measured" else None
        if shape.image_px is None:
            target = shape.prompt_tokens
            prompt = synth_text(rng, cal.words_for("completions", None, target, 0), nonce)
            payload = {"prompt": prompt, "max_tokens": shape.output_tokens, "ignore_eos": True}
            out.append(RequestSpec(i, phase, "completions", payload, target, shape.output_tokens, _hash(prompt),
                                   offset_s=offset_s))
            continue
        key = "shared" if shape.reuse_image else i
        if key not in images:
            image_rng = _rng(seed, cell.suite, cell.workload, cell.concurrency, cell.stream, "image", key, trial)
            data = (stand_in_image(image_rng, shape.image_px) if stand_in_images
                    else synth_image(image_rng, shape.image_px, shape.image_format))
            images[key] = (data, _hash(data))
        data, ihash = images[key]
        img_tok = image_tokens(spec.model, shape.image_px, shape.image_px)
        target = shape.text_tokens + chat_overhead + img_tok
        text = synth_text(rng, cal.words_for("chat", shape.image_px, target, chat_overhead + img_tok), nonce)
        mime = "image/png" if shape.image_format == "png" or stand_in_images else "image/jpeg"
        url = f"data:{mime};base64," + base64.b64encode(data).decode()
        payload = {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}],
            "max_tokens": shape.output_tokens, "ignore_eos": True}
        out.append(RequestSpec(i, phase, "chat", payload, target, shape.output_tokens, _hash(text, ihash),
                               shape.image_px, ihash, offset_s))
    if spec.tracing.enabled:
        for k in traced_indices(cell.n_measured, spec.tracing.per_cell):
            out[cell.n_warmup + k] = replace(out[cell.n_warmup + k], traced=True)
    return out


def calibration_keys(spec: ExperimentSpec) -> set[tuple[str, int | None]]:
    """The (api, image edge) pairs the spec's requests use: what prompt synthesis is calibrated for
    (tasks.load.calibrate), known without synthesising a request."""
    keys: set[tuple[str, int | None]] = set()
    for cell in plan_cells(spec):
        shape = _shape_for(spec, cell, _rng(spec.seed, cell.cell_id, "calibration"))
        keys.add(("chat", shape.image_px) if shape.image_px else ("completions", None))
    return keys


def hash_prompt_hashes(prompt_hashes: list[str]) -> str:
    return _hash(*prompt_hashes)


def prompt_set_hash(requests: list[RequestSpec]) -> str:
    """One hash for a cell's whole request list (warm-up and measured, in order)."""
    return hash_prompt_hashes([r.prompt_hash for r in requests])
