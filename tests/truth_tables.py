"""Truth tables made by the simulator itself (analysis.truth.as_truth_table of tasks.sim.engine_times): a "real
engine" whose constants were moved from the preset's, so that what fits or compares them must find the moves."""
from __future__ import annotations

from pathlib import Path

from epdbench.analysis import fit, truth
from epdbench.specs.models import load_spec
from epdbench.tasks.sim.engine_times import simulate_cells

H100 = "NVIDIA H100 80GB HBM3"
# The hidden engine: compute 0.7 and memory 1.3 times the measured laws' speed, a vision tower 0.8 times as fast
# with 20 ms more per pass, and 2 ms more per step than the preset's 1 ms; its API server slower than the preset's at
# tokenizing (2 µs a token, 3 ms a request) and at processing images (70 ms a megapixel).
HIDDEN = {"measured_compute_factor": 0.7, "measured_hbm_factor": 1.3, "measured_vision_factor": 0.8,
          "vision_pass_ms": 20.0, "step_overhead_ms": 3.0, "tokenize_us_per_token": 2.0, "request_render_ms": 3.0,
          "image_preprocess_ms_per_mp": 70.0}


def synthetic_truth(path: Path, spec=None, hidden: dict = HIDDEN, gpu: str = H100) -> Path:
    """Write the spec's cold cells (default: the vllm-truth preset) served by the simulator with `hidden` constants, as
    a truth table measured on `gpu`; returns its path."""
    spec = spec or load_spec("vllm-truth")
    # its cold cells: a real table marks a reused image's cell warm by its cache columns, which the simulator's
    # table does not carry (analysis.truth.usable leaves such a row out)
    spec = spec.model_copy(update={"suites": [s for s in spec.suites if not getattr(s, "reuse_image", False)]})
    table = truth.as_truth_table(simulate_cells(fit.spec_with(spec, hidden)), gpu, spec.model.name,
                                 vllm_version="simulated")
    table.to_csv(path, index=False)
    return path
