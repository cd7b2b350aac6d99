"""Calibrate prompt synthesis against the endpoint's own tokenizer (POST /tokenize), once per run.

Two probes per (api, image size) give tokens per word and the fixed overhead (chat template, image
tokens); the same calibration then serves every configuration, so prompts stay matched.
"""
from __future__ import annotations

import base64
import json
import random
import urllib.request

from epdbench.specs.workload import Calibration, synth_image, synth_text

PROBE_WORDS = (64, 1024)


def _count(tokenize_url: str, body: dict) -> int:
    req = urllib.request.Request(tokenize_url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return int(json.loads(r.read())["count"])


def _probe_body(model: str, api: str, image_px: int | None, n_words: int) -> dict:
    text = synth_text(random.Random(n_words), n_words, "calibration")
    if api == "completions":
        return {"model": model, "prompt": text}
    image = base64.b64encode(synth_image(random.Random(0), image_px)).decode()
    return {"model": model, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
        {"type": "text", "text": text}]}]}


def calibrate(engine_url: str, model: str, keys: set[tuple[str, int | None]]) -> Calibration:
    """Linear fit tokens = slope × words + overhead for each (api, image edge) key, from the endpoint's
    POST /tokenize."""
    url = engine_url.rstrip("/") + "/tokenize"
    return fit_calibration(lambda body: _count(url, body), model, keys)


def fit_calibration(count, model: str, keys: set[tuple[str, int | None]]) -> Calibration:
    """The same fit with any token counter `count(body) -> tokens` (the virtual-time simulator counts
    with its own tokenizer)."""
    fits: dict[str, tuple[float, float]] = {}
    for api, px in sorted(keys, key=lambda k: (k[0], k[1] or 0)):
        n1, n2 = PROBE_WORDS
        c1 = count(_probe_body(model, api, px, n1))
        c2 = count(_probe_body(model, api, px, n2))
        slope = (c2 - c1) / (n2 - n1)
        fits[Calibration.key(api, px)] = (slope, c1 - slope * n1)
    return Calibration(fits)

