"""report.html in headless Chromium: every plot decodes and shows; the screenshot is kept in
tests/artifacts/report.png. Skipped (with the reason) where chromium is not installed."""
from __future__ import annotations

import numpy as np
from PIL import Image

from epdbench.reports.plots import PALETTE
from epdbench.specs.models import spec_to_yaml
from epdbench.tasks.rundir.report_files import rerender
from epdbench.tasks.rundir.results import append_records, write_json
from tests.reports.browser import chromium, probe, screenshot
from tests.reports.synthetic_run import synthetic_meta, synthetic_records, synthetic_verdicts


def palette_pixels(png) -> int:
    """Pixels drawn in a configuration color (plot lines, markers and bars only)."""
    rgb = np.asarray(Image.open(png).convert("RGB")).astype(int)
    hits = np.zeros(rgb.shape[:2], dtype=bool)
    for color in PALETTE[:4]:
        target = np.array([int(color[i:i + 2], 16) for i in (1, 3, 5)])
        hits |= np.abs(rgb - target).sum(axis=2) < 30
    return int(hits.sum())


def test_report_html_opens_with_every_plot_visible(tmp_path, tiny_spec):
    chromium()
    rdir = tmp_path / "run"
    rdir.mkdir()
    append_records(rdir / "records.parquet", synthetic_records(tiny_spec).to_dict("records"))
    (rdir / "spec.yaml").write_text(spec_to_yaml(tiny_spec))
    write_json(rdir / "outcome.json", {"meta": synthetic_meta(tiny_spec), "verdicts": synthetic_verdicts(tiny_spec)})
    rerender(rdir)
    n_plots = len(list((rdir / "plots").glob("*.png")))
    page = probe(rdir / "report.html", tmp_path)
    assert page["images"] == page["decoded"] == n_plots == 12    # 4 suites at one concurrency: CDF, throughput, Pareto
    shot = screenshot(rdir / "report.html", tmp_path, "report.png", min(page["height"], 16000))
    assert Image.open(shot).size == (1400, min(page["height"], 16000))
    assert palette_pixels(shot) > 20000         # the plots' colored lines and bars are on screen
