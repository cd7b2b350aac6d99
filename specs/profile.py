"""A calibration profile: the simulator's free constants fitted to one hardware run (`epdbench calibrate`),
applied to a spec's hardware section by `compare --profile` and `whatif --profile`.

A profile describes the simulator's physics (how close to the datasheet the GPUs, links and engine steps
get), so it replaces hardware fields of a spec and nothing else. Pure: reading the file is the only I/O.
"""
from __future__ import annotations

import hashlib
import json
from datetime import date
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from epdbench.specs.base import Strict, dump_yaml
from epdbench.specs.models import (ExperimentSpec, HardwareSpec, SpecError, describe_validation_error, parse_spec,
                                   roofline_as_before, spec_changes)
from epdbench.specs.node import OperatorTimings

HOLDOUT_VERDICTS = ("better", "worse", "no clear difference", "too few cells")   # analysis.holdout

# The hardware fields the cost model reads that no datasheet gives: what `calibrate --from` fits to a run's client
# figures. (The per-ring-step NVLink latency is left out: for a given TP it only adds to the all-reduce's base
# latency.) The efficiencies act under the roofline laws, the measured factors under the measured ones
# (hardware.op_laws).
FREE_CONSTANTS = ("compute_efficiency", "hbm_efficiency", "measured_compute_factor", "measured_hbm_factor",
                  "step_overhead_ms", "allreduce_latency_us", "tcp_gb_s", "tcp_latency_ms", "rdma_efficiency",
                  "rdma_latency_ms", "image_preprocess_ms_per_mp", "request_hop_ms")
# The free constants that act inside an engine, on its steps and vision passes, and in its API server before the
# engine core queues a request: what `calibrate --engine-steps` fits to the engines' own timings (vLLM's request
# histograms: analysis.engine_steps). The vision tower's speed is among them alone: a client's TTFT cannot tell it
# from the API server's image preprocessing and the hops, an engine's prefill time can; and its TTFT less queue and
# prefill is the API server's tokenization and image processing alone, without the client's network.
ENGINE_CONSTANTS = ("compute_efficiency", "hbm_efficiency", "measured_compute_factor", "measured_hbm_factor",
                    "measured_vision_factor", "vision_pass_ms", "step_overhead_ms", "allreduce_latency_us",
                    "tokenize_us_per_token", "request_render_ms", "image_preprocess_ms_per_mp")
# What a profile may set: every free constant of either fit.
PROFILE_CONSTANTS = FREE_CONSTANTS + tuple(n for n in ENGINE_CONSTANTS if n not in FREE_CONSTANTS)


def check_constant(name: str, value: float) -> float:
    """`value` if it is allowed for hardware field `name` (HardwareSpec's own bounds), else ValueError."""
    if name not in PROFILE_CONSTANTS:
        raise ValueError(f"'{name}' is not a free constant of the simulator; allowed: "
                         f"{', '.join(PROFILE_CONSTANTS)}")
    field = HardwareSpec.model_fields[name]
    try:
        return TypeAdapter(Annotated[float, *field.metadata]).validate_python(value)
    except ValidationError as e:
        raise ValueError(f"{name}: {e.errors()[0]['msg']}") from None


class ErrorTail(Strict):
    p90_error: float = Field(ge=0, title="90th percentile error",
                             description="The 90th percentile over the cells of |predicted / observed − 1| "
                                         "(numpy's linear interpolation: analysis.error_tail).")
    worst_cell: str = Field(title="Worst cell", description="The cell of the largest |predicted / observed − 1|, in "
                                                            "words: configuration, suite, workload, concurrency.")
    worst_ratio: float = Field(title="Worst cell's ratio", description="Its predicted / observed: under 1, the "
                                                                      "prediction was the lower.")


class CalibrationProfile(Strict):
    spec: str | None = Field(title="Spec", description="Name of the spec the profile was fitted for; absent in a "
                                                        "profile of operator timings made without --spec.")
    spec_fingerprint: str | None = Field(title="Spec fingerprint",
                                         description="specs.models.spec_fingerprint of that spec (as the run used "
                                                     "it); absent with the spec.")
    source: str = Field(title="Source", description="The summary.csv or records.parquet the constants were fitted "
                                                    "to, or the gpu_ops CSV of the operator timings.")
    gpu: str | None = Field(None, title="GPU",
                            description="The GPU of the fitted run (its spec's hardware.gpu): the efficiencies are "
                                        "fractions of that GPU's datasheet figures. Absent in profiles written "
                                        "before it was recorded.")
    model: str | None = Field(None, title="Model", description="The model of the fitted run (its spec's model.name).")
    source_target: Literal["sim", "kubernetes", "local"] | None = Field(
        None, title="Source target",
        description="Where the fitted run ran, from the spec.yaml of its results folder: sim (the simulator's own "
                    "emulated figures, not hardware), kubernetes or local (real engines on one host); absent when "
                    "the source was a table without its run's folder.")
    created: date = Field(title="Date", description="When the profile was fitted.")
    hardware: dict[str, float] = Field(title="Fitted constants",
                                       description="Hardware fields the fit set; applying the profile replaces "
                                                   "these and leaves every other field of the spec as it is.")
    left_as_in_spec: list[str] = Field(default_factory=list, title="Not fitted",
                                       description="Free constants the run's cells could not identify.")
    evaluations: int = Field(0, ge=0, title="Simulator runs", description="Simulator runs the fit used.")
    fit_error: dict[str, float | None] = Field(default_factory=dict, title="Fit error",
                                               description="Per metric: median relative error over the fitted "
                                                           "cells, with the fitted constants.")
    holdout_seed: int | None = Field(None, ge=0, title="Hold-out seed",
                                     description="Seed of the split into fitted and held-out cells.")
    holdout_error: dict[str, float | None] = Field(default_factory=dict, title="Hold-out error",
                                                   description="Per metric: median relative error over the "
                                                               "held-out cells, fitting on the other half.")
    holdout_tail: dict[str, ErrorTail] = Field(
        default_factory=dict, title="Hold-out error past the median",
        description="Per metric, over the same held-out cells as holdout_error: the 90th percentile of the error and "
                    "the worst cell (analysis.error_tail), so that the error bar says how far off the worst cells "
                    "are and not only the typical one. Absent in profiles written before it was recorded.")
    holdout_spec_error: dict[str, float | None] = Field(
        default_factory=dict, title="Hold-out error with the spec's constants",
        description="Per metric: median relative error over the same held-out cells with the spec's own "
                    "constants, the baseline the fit must beat.")
    cells_fitted: dict[str, str] = Field(
        default_factory=dict, title="Cells fitted",
        description="Per configuration and suite of the run the fit saw ('config|suite'): a fingerprint of what "
                    "the virtual-time core reproduces of its cells (cell_fingerprints), so that a prediction for "
                    "other cells — another seed, shape, deployment or node — says its error was not measured. "
                    "Absent in profiles written before it was recorded.")
    op_laws: Literal["measured", "roofline"] = Field(
        "roofline", title="Operator laws",
        description="The cost model's operator laws the constants were fitted on (hardware.op_laws): applying the "
                    "profile sets them, so its constants act as they were fitted. Absent in profiles written before "
                    "the measured laws: roofline.")
    op_timings: OperatorTimings | None = Field(
        None, title="Operator timings",
        description="The gpu_ops measurement the measured laws come from (epdbench calibrate --ops, or the fitted "
                    "run's own): applying the profile sets hardware.op_timings. Absent: the spec's own.")
    fitted_figures: Literal["client", "engine", "transfers"] = Field(
        "client", title="Figures fitted",
        description="client: a run's client-side figures (TTFT, TPOT, throughput: epdbench calibrate --from); "
                    "engine: the engines' own step timings, prefill time and decode time per token (epdbench "
                    "calibrate --engine-steps), so its errors are of those figures; transfers: the KV connector's "
                    "own transfer timings (epdbench calibrate --transport), its errors those of the run's client "
                    "figures, none of which the fit read. Absent in profiles written before it was recorded: "
                    "client.")
    holdout_verdict: dict[str, Literal[HOLDOUT_VERDICTS]] = Field(
        default_factory=dict, title="Hold-out verdict",
        description="Per metric: whether the fitted constants predict the held-out cells better or worse than the "
                    "spec's, cell by cell beyond chance (a sign test: analysis.holdout), no clear difference, or too "
                    "few cells to tell.")

    @field_validator("hardware")
    @classmethod
    def _check_hardware(cls, values: dict[str, float]) -> dict[str, float]:
        return {name: check_constant(name, v) for name, v in values.items()}

    @model_validator(mode="after")
    def _timings_need_measured_laws(self) -> CalibrationProfile:
        if self.op_timings is not None and self.op_laws != "measured":
            raise ValueError("op_timings: operator timings need op_laws: measured")
        return self

    @field_validator("left_as_in_spec")
    @classmethod
    def _check_left(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n not in PROFILE_CONSTANTS]
        if unknown:
            raise ValueError(f"not free constants: {', '.join(unknown)}")
        return names


def parse_profile(data: dict, source: str = "profile") -> dict:
    """A profile mapping, validated; SpecError (one line naming the field) when it is not one."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at the top level (a profile written by epdbench calibrate)")
    try:
        return CalibrationProfile.model_validate(data).model_dump(mode="json")
    except ValidationError as e:
        raise SpecError(describe_validation_error(e, source, CalibrationProfile)) from None


def load_profile(path: str | Path, option: str = "--profile") -> dict:
    """The profile in YAML file `path`; SpecError on a missing or bad file, an unknown key or an out-of-range
    value (a missing file named as the `option` that gave it)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{option} {path}: no such file (write one with epdbench calibrate)")
    try:
        data = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    return parse_profile(data, str(path))


def calibration_changes(stored: ExperimentSpec, spec: ExperimentSpec) -> list[str]:
    """What `spec` changes of `stored` (the spec.yaml a run kept) in what the virtual-time core reproduces of the
    run (specs.models.spec_changes): the free constants are where the fit starts, and the name and target are
    not modelled, so none of them counts."""
    hardware = stored.hardware.model_copy(update={n: getattr(spec.hardware, n) for n in PROFILE_CONSTANTS})
    return spec_changes(stored.model_copy(update={"hardware": hardware, "target": spec.target, "name": spec.name}),
                        spec)


def cell_fingerprints(spec: ExperimentSpec) -> dict[str, str]:
    """Per configuration and suite of `spec` ('config|suite'): a fingerprint of what the virtual-time core
    reproduces of its cells — the seed, model, engine, the node but for the free constants, the configuration's
    deployment (not its name) and the suite. The same fingerprint: the same cells, whatever the spec's name,
    target, trials or free constants."""
    common = spec.model_dump(mode="json", include={"seed", "model", "engine", "hardware"})
    roofline_as_before(common["hardware"])        # profiles fitted before the measured laws keep their cells
    for name in PROFILE_CONSTANTS:
        common["hardware"].pop(name, None)
    out = {}
    for c in spec.configurations:
        deployment = c.model_dump(mode="json", exclude={"name"})
        for suite in spec.suites:
            data = json.dumps({**common, "configuration": deployment, "suite": suite.model_dump(mode="json")},
                              sort_keys=True)
            out[f"{c.name}|{suite.name}"] = hashlib.sha256(data.encode()).hexdigest()[:16]
    return out


def unfitted_cells(profile: dict, spec: ExperimentSpec) -> list[str] | None:
    """The 'config|suite' pairs of `spec` whose cells are none the profile was fitted to (another seed, shape,
    deployment or node); None when the profile does not record its cells."""
    fitted = set((profile.get("cells_fitted") or {}).values())
    if not fitted:
        return None
    return [pair for pair, fp in cell_fingerprints(spec).items() if fp not in fitted]


def fitted_elsewhere(spec: ExperimentSpec, profile: dict) -> list[str]:
    """Where the run a profile was fitted to differs from `spec` in what its constants depend on — the GPU (the
    efficiencies are fractions of its datasheet figures) and the model (its kernels) — in words; empty when
    both are the same, or the profile does not record them."""
    return [f"{what} {fitted} (this spec: {here})"
            for what, fitted, here in (("GPU", profile.get("gpu"), spec.hardware.gpu),
                                       ("model", profile.get("model"), spec.model.name))
            if fitted is not None and fitted != here]


def error_bar(profile: dict | None, spec: ExperimentSpec | None = None) -> str:
    """What is known of how far predictions made with `profile` for `spec` are off, in words: its measured
    hold-out error (median |predicted / observed − 1| per metric on cells it was not fitted to), or that none
    was measured — nor is there one when the profile was fitted on another GPU or model than `spec`'s; a
    profile fitted to a run of another spec says its error was measured on that spec's cells."""
    if profile is None:
        return ("uncalibrated: the spec's hardware constants, no measured error bar (epdbench calibrate fits them "
                "to a run and measures one)")
    engine = {"engine": "fitted to engine step timings (its errors are of the engines' prefill and decode times, "
                        "not of client TTFT or throughput): ",
              "transfers": "the KV link fitted to the connector's own transfer timings: "}.get(
                  profile.get("fitted_figures"), "")
    if profile.get("source_target") == "sim":
        return "fitted to a simulator run (emulated figures, not hardware): " + engine + _error_bar(profile, spec)
    return engine + _error_bar(profile, spec)


def _error_bar(profile: dict, spec: ExperimentSpec | None) -> str:
    if profile.get("op_timings") is not None and not profile.get("hardware"):
        return ("operator timings, no fitted run: each operator within the measured laws' stated error of its "
                "timing (docs/simulator.md, Operator laws); no served run's error measured")
    held = {k: v for k, v in (profile.get("holdout_error") or {}).items() if v is not None}
    tails = profile.get("holdout_tail") or {}
    measured = ", ".join(f"{k} {v:.1%}{_tail_text(tails.get(k))}" for k, v in held.items())
    moved = fitted_elsewhere(spec, profile) if spec is not None else []
    if moved:
        return (f"no measured error bar: the profile was fitted to a run on {' and '.join(moved)}"
                + (f", so its error on cells it was not fitted to ({measured}) was measured there, not for this spec"
                   if held else ", and has no hold-out check"))
    unrecorded = (" (the profile does not say which GPU and model it was fitted on: this holds only if they are "
                  "this spec's)"
                  if spec is not None and (profile.get("gpu") is None or profile.get("model") is None) else "")
    if not held:
        return f"no hold-out check in the profile: its error on cells it was not fitted to is not known{unrecorded}"
    worse = _worse_than_spec(profile)
    unfitted = unfitted_cells(profile, spec) if spec is not None else None
    if unfitted is None:        # a profile that does not record its cells: the spec's name is all there is
        other = spec is not None and profile.get("spec") not in (None, spec.name)
        elsewhere = (f"; those were cells of a run of spec {profile['spec']}, and this spec ({spec.name}) runs "
                     "others: for them no error was measured" if other else "")
    else:
        shown = ", ".join(p.replace("|", " in ") for p in unfitted[:3])
        more = f" and {len(unfitted) - 3} more" if len(unfitted) > 3 else ""
        n = len(spec.configurations) * len(spec.suites)          # the pairs unfitted_cells fingerprinted
        if not unfitted:
            elsewhere = ""
        elif len(unfitted) == n:
            elsewhere = ("; none of this spec's cells is among the run's (their seed, suites, deployments or node "
                         "differ): for them no error was measured")
        else:
            elsewhere = (f"; for {len(unfitted)} of this spec's {n} configuration-suite pairs ({shown}{more}) no "
                         "error was measured: their seed, suite, deployment or node differ from the run's")
    past = "; p90 and the worst cell beside it" if any(k in tails for k in held) else ""
    return (f"its predictions' measured error on cells it was not fitted to (median |predicted/observed − 1|{past}): "
            f"{measured}{unrecorded}"
            + (f"; on those cells the spec's own constants predicted better for {worse}" if worse else "")
            + elsewhere)


def _tail_text(tail: dict | None) -> str:
    """' (p90 12.0%, worst text 1024/128 c=8 at 0.870)' of a holdout_tail entry; '' without one."""
    if not tail:
        return ""
    return f" (p90 {tail['p90_error']:.1%}, worst {tail['worst_cell']} at {tail['worst_ratio']:.3f})"


def _worse_than_spec(profile: dict) -> str:
    """The metrics whose hold-out check found the fit worse than the spec's constants, with both errors."""
    spec_error, held = profile.get("holdout_spec_error") or {}, profile.get("holdout_error") or {}
    return ", ".join(f"{m} ({held[m]:.1%} against {spec_error[m]:.1%})" if held.get(m) is not None
                     and spec_error.get(m) is not None else m
                     for m, v in (profile.get("holdout_verdict") or {}).items() if v == "worse")


def apply_profile(spec: ExperimentSpec, profile: dict) -> ExperimentSpec:
    """A copy of `spec` whose hardware fields are replaced by the profile's fitted constants, on the operator laws
    they were fitted on (and the profile's operator timings, if it carries some)."""
    profile = parse_profile(profile)
    data = spec.model_dump(mode="json")
    data["hardware"].update(profile["hardware"], op_laws=profile["op_laws"])
    if profile["op_timings"] is not None:
        data["hardware"]["op_timings"] = profile["op_timings"]
    return parse_spec(data, "spec with profile")


def profile_origin(profile: dict) -> str:
    """Where a profile's figures come from, in words: a gpu_ops CSV's operator timings, or a fitted run (and its
    constants), and the operator laws they act on."""
    fitted = ", ".join(f"{name} {value:.3g}" for name, value in profile["hardware"].items())
    timings = profile.get("op_timings")
    if timings is not None and not fitted:
        return (f"operator timings measured on {timings['gpu']} ({profile['source']}, {profile['created']}), "
                "the measured laws derived from them")
    on = ", ".join(x for x in (profile.get("gpu"), profile.get("model")) if x)
    laws = "roofline laws" if profile.get("op_laws", "roofline") == "roofline" else "measured laws"
    what = {"engine": "the engine step timings of a run", "transfers": "the KV transfer timings of a run"}.get(
        profile.get("fitted_figures"), "a run")
    return (f"fitted to {what} of spec {profile['spec']}" + (f" ({on})" if on else "")
            + f" ({profile['source']}, {profile['created']}) on the {laws}: {fitted or 'no constant'}")


def profile_to_yaml(profile: dict | CalibrationProfile) -> str:
    """The profile as YAML (validated first), with a header saying what it is."""
    data = profile.model_dump(mode="json") if isinstance(profile, CalibrationProfile) else parse_profile(profile)
    header = ("# epdbench calibration profile: simulator constants fitted to a run, or operator timings to derive its "
              "laws from.\n# Use with: epdbench compare --profile THIS | epdbench whatif --profile THIS\n")
    return header + dump_yaml(data)
