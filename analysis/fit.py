"""Fitting the simulator's free constants to a run (pure: the simulator is injected, no I/O).

`predict(spec) -> summary frame` runs a spec in the simulator (tasks.sim.vrun.simulate_summary) and returns the
summary columns of a run. The fit compares it with an observed summary (a run's summary.csv, or a published
table with only some metric columns) cell by cell — cells matched on config, suite, workload, concurrency and
stream, trials averaged — and moves the hardware constants of specs.profile.FREE_CONSTANTS to bring the two
together:

- loss: mean squared log ratio of predicted to observed over every (cell, metric) the observed table has; a
  figure the simulator did not produce at some constants counts as off by MISSING_RATIO;
- search: a derivative-free Gauss–Newton trust-region method (analysis.dfo) in log space within BOUNDS,
  its first interpolation set the spec's constants — one the spec sets to zero (log space has no zero) from
  where it starts to move an observed figure by MIN_EFFECT (_scale) — and one point per
  constant (its identifiability probe),
  one simulator run per step and at most a given number in all. Nelder–Mead needed about a thousand runs to
  recover seven constants of a synthetic law (tests/analysis/test_fit.py) that this recovers in a few dozen;
- identifiability: a constant is fitted only if the run has a configuration that uses it (TCP figures need a
  TCP or EPD configuration, RDMA figures an RDMA one, the all-reduce latency a role with TP > 1, the image
  preprocessing cost a cell that sends images; the roofline's efficiencies the roofline laws, the measured
  factors the measured ones: hardware.op_laws, physics.measured.law_sources) and moving
  it by STEP_RATIO, or failing that by WIDE_RATIO, moves some observed figure by at least MIN_EFFECT —
  otherwise it is left as the spec has it, and the result says why (the probe that identified it starts the
  search);
- hold-out: cells split by a seeded permutation within each configuration (half, rounded up, to the fit).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from epdbench.analysis import table_check
from epdbench.analysis.dfo import BudgetExhausted, least_squares_dfo
from epdbench.physics.measured import law_sources, vision_measured
from epdbench.specs.models import ExperimentSpec
from epdbench.specs.profile import FREE_CONSTANTS
from epdbench.specs.suites import sends_images as suite_sends_images
from epdbench.specs.workload import plan_cells

MATCH_KEYS = ["config", "suite", "workload", "concurrency", "stream"]
# Figures a fit reads when the table has them. itl_max_ms (one sample per cell) and the per-GPU throughput
# (output_tok_s again) are left out.
FIT_METRICS = ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "output_tok_s", "req_s")
# Search bounds (natural units). Efficiencies are fractions of a datasheet figure; a latency or overhead "≥ 0"
# is searched from 1 µs (log space has no zero).
BOUNDS: dict[str, tuple[float, float]] = {
    "compute_efficiency": (0.05, 1.0),
    "hbm_efficiency": (0.05, 1.0),
    "measured_compute_factor": (0.05, 10.0),
    "measured_hbm_factor": (0.05, 10.0),
    "measured_vision_factor": (0.05, 10.0),
    "rdma_efficiency": (0.05, 1.0),
    "step_overhead_ms": (1e-3, 1e3),
    "allreduce_latency_us": (1e-3, 1e4),
    "tcp_latency_ms": (1e-3, 1e3),
    "rdma_latency_ms": (1e-3, 1e3),
    "tcp_gb_s": (1e-3, 1e4),
    "image_preprocess_ms_per_mp": (1e-3, 1e4),
    "request_hop_ms": (1e-3, 1e3),
    "tokenize_us_per_token": (1e-3, 1e3),
    "request_render_ms": (1e-3, 1e3),
    "vision_pass_ms": (1e-3, 1e3),
}
STEP_RATIO = 1.5      # first trust region and identifiability probe: each constant moved by 50 %,
WIDE_RATIO = 10.0     # or, if that moved too little, 10-fold (a 0.05 ms latency hides in a 30 ms TTFT) ...
MIN_EFFECT = 0.01     # ... must move some observed figure by 1 % to count as identified by the run
MISSING_RATIO = 10.0  # an observed figure the simulator left null counts as off by this factor
XTOL = 1e-3           # stop when the trust region is narrower than 0.1 %
# The search's points lie on a grid in log space (GRID: 1e-6 relative, far inside XTOL) and the constants it
# evaluates are rounded to SNAP_DIGITS significant digits. A virtual-time run's figures jump with its constants
# (events reorder), so without them the last bits of the search's arithmetic, which differ between machines and
# library builds, chose the profile: the smoke hold-out benchmark's steps moved by 1e-13 gave other constants
# (TCP 2.23 GB/s instead of 2.11, image preprocessing 35.5 ms/Mpx instead of 37.7) and another held-out error.
GRID = 1e-6
SNAP_DIGITS = 6

LINK_CONSTANTS = {"tcp": ("tcp_gb_s", "tcp_latency_ms"), "rdma": ("rdma_efficiency", "rdma_latency_ms")}
LAW_CONSTANTS = {"roofline": ("compute_efficiency", "hbm_efficiency"),
                 "measured": ("measured_compute_factor", "measured_hbm_factor")}


class FitInputError(ValueError):
    """An observed table the fit cannot use; the message is one line saying what is missing."""


def _cells(frame: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per cell (index MATCH_KEYS), `metrics` as floats averaged over trials; null, non-numeric and
    non-positive figures are NaN (a log ratio needs a positive figure)."""
    frame = frame.reset_index(drop=True)
    keys = frame[MATCH_KEYS].copy()
    keys = keys[keys.notna().all(axis=1)]
    for k in ("config", "suite", "workload", "stream"):
        keys[k] = keys[k].astype(str).str.strip()
    conc = pd.to_numeric(keys["concurrency"], errors="coerce")
    keys = keys[conc.notna() & (conc == conc.round())]
    keys["concurrency"] = conc[keys.index].astype(int)
    values = frame.loc[keys.index, metrics].apply(pd.to_numeric, errors="coerce").astype(float)
    values = values.where(values > 0)
    return pd.concat([keys, values], axis=1).groupby(MATCH_KEYS, sort=True)[metrics].mean()


def observed_cells(summary: pd.DataFrame, metrics: list[str] | None = None,
                   notes: list[str] | None = None) -> pd.DataFrame:
    """The observed table as cells × metrics (index MATCH_KEYS). `metrics` None: every FIT_METRICS column the
    table has. FitInputError when the key columns, the metric columns or any usable figure are missing, or a
    key or figure cannot be read (analysis.table_check: the row is named, never quietly left out); figures that
    are not positive are left out, and `notes` (if given) gets a line saying so."""
    missing = [k for k in MATCH_KEYS if k not in summary.columns]
    if missing:
        raise FitInputError(f"no key column(s) {', '.join(missing)}: a summary needs {', '.join(MATCH_KEYS)}")
    if metrics is None:
        metrics = [m for m in FIT_METRICS if m in summary.columns]
        if not metrics:
            raise FitInputError(f"no metric column: give at least one of {', '.join(FIT_METRICS)}")
    else:
        absent = [m for m in metrics if m not in summary.columns]
        if absent:
            raise FitInputError(f"no metric column(s) {', '.join(absent)}; the table has "
                                f"{', '.join(m for m in FIT_METRICS if m in summary.columns) or 'none of them'}")
    if problem := table_check.unreadable(summary, MATCH_KEYS, metrics):
        raise FitInputError(problem)
    if notes is not None:
        notes.extend(n for n in (table_check.non_positive(summary, metrics),
                                 table_check.repeated(summary, MATCH_KEYS)) if n)
    cells = _cells(summary, metrics).dropna(how="all")
    if cells.empty:
        raise FitInputError(f"no cell with a positive figure in {', '.join(metrics)} and complete keys")
    return cells


def predicted_cells(summary: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """A simulated summary as cells × metrics, as observed_cells shapes the observed one."""
    for m in metrics:
        if m not in summary.columns:
            summary = summary.assign(**{m: np.nan})
    return _cells(summary, metrics)


def usable_rows(summary: pd.DataFrame, notes: list[str] | None = None) -> pd.DataFrame:
    """The rows of an observed summary that may be fitted: cells flagged `contaminated` (bent by host load) and
    cells with failed requests are left out (analysis.table_check.usable); `notes` (if given) gets a line per
    kind left out."""
    rows, said = table_check.usable(summary)
    if notes is not None:
        notes.extend(said)
    return rows


def _log_ratios(observed: pd.DataFrame, predicted: pd.DataFrame) -> np.ndarray:
    """log(predicted / observed) per observed figure (flattened); NaN where the prediction is missing."""
    p = predicted.reindex(index=observed.index, columns=observed.columns).to_numpy(dtype=float)
    o = observed.to_numpy(dtype=float)
    keep = ~np.isnan(o)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.log(p[keep] / o[keep])
    return np.where(np.isfinite(r), r, np.nan)


def residuals(observed: pd.DataFrame, predicted: pd.DataFrame) -> np.ndarray:
    """log(predicted / observed) per observed figure; a missing prediction counts as off by MISSING_RATIO."""
    r = _log_ratios(observed, predicted)
    return np.where(np.isnan(r), math.log(MISSING_RATIO), r)


def loss(observed: pd.DataFrame, predicted: pd.DataFrame) -> float:
    """Mean squared log ratio of predicted to observed over the observed figures (see residuals)."""
    r = residuals(observed, predicted)
    return float(np.mean(r * r)) if r.size else 0.0


def relative_errors(observed: pd.DataFrame, predicted: pd.DataFrame) -> dict[str, float | None]:
    """Per metric: the median over cells of |predicted / observed − 1| (None: no cell has both figures)."""
    out: dict[str, float | None] = {}
    p = predicted.reindex(index=observed.index, columns=observed.columns)
    for m in observed.columns:
        both = observed[m].notna() & p[m].notna()
        out[m] = float(np.median(np.abs(p[m][both] / observed[m][both] - 1))) if both.any() else None
    return out


def matched(observed: pd.DataFrame, predicted: pd.DataFrame) -> pd.DataFrame:
    """The observed cells the prediction has."""
    return observed[observed.index.isin(predicted.index)]


def holdout_mask(cells: pd.Index, seed: int) -> np.ndarray:
    """True for the held-out cells: within each configuration, a seeded permutation of its cells sends the
    first half (rounded up) to the fit and the rest to the hold-out, so every configuration is fitted."""
    configs = np.asarray(cells.get_level_values("config"), dtype=object)
    rng = np.random.default_rng(seed)
    held = np.zeros(len(cells), dtype=bool)
    for config in sorted(set(configs)):
        rows = np.flatnonzero(configs == config)
        perm = rng.permutation(rows)
        held[perm[math.ceil(len(rows) / 2):]] = True
    return held


def spec_for_cells(spec: ExperimentSpec, observed: pd.DataFrame) -> ExperimentSpec:
    """`spec` narrowed to the configurations and suites the observed cells name (each configuration runs on a
    fresh deployment and each suite's prompts and images are its own, so the others change nothing the fit
    reads); FitInputError when the spec has no such configuration or suite, or runs none of the cells."""
    for level, have in (("config", [c.name for c in spec.configurations]), ("suite", [s.name for s in spec.suites])):
        unknown = sorted(set(observed.index.get_level_values(level)) - set(have))
        if unknown:
            raise FitInputError(f"{level} {', '.join(unknown)} not in spec {spec.name} (it has {', '.join(have)}); "
                                "give the spec the run used")
    configs = set(observed.index.get_level_values("config"))
    suites = set(observed.index.get_level_values("suite"))
    spec = spec.model_copy(update={"configurations": [c for c in spec.configurations if c.name in configs],
                                   "suites": [s for s in spec.suites if s.name in suites]})
    if len(unplanned(spec, observed)) == len(observed):
        example = ", ".join(str(k) for k in observed.index[:1])
        raise FitInputError(f"no observed cell is one the spec runs (e.g. {example} is not): check workload, "
                            "concurrency and stream against the spec")
    return spec


def unplanned(spec: ExperimentSpec, observed: pd.DataFrame) -> list[tuple]:
    """The observed cells (index keys) that no configuration of `spec` runs."""
    planned = {(c.name, cell.suite, cell.workload, cell.concurrency, cell.stream)
               for c in spec.configurations for cell in plan_cells(spec)}
    return [key for key in observed.index if key not in planned]


def sends_images(spec: ExperimentSpec) -> bool:
    """Whether some suite of the spec sends images (specs.suites.sends_images)."""
    return any(suite_sends_images(s) for s in spec.suites)


def structural_constants(spec: ExperimentSpec, constants: Sequence[str] = FREE_CONSTANTS
                         ) -> tuple[list[str], dict[str, str]]:
    """(of `constants`, those the spec's configurations use, {constant: why not} for the others). KV moves over
    the configuration's transport; EPD also sends image embeddings over TCP; all-reduces need TP > 1; the vision
    tower's speed needs images and its measured law."""
    used = {"tcp": any(c.kv_transport == "tcp" or c.topology == "epd" for c in spec.configurations),
            "rdma": any(c.kv_transport == "rdma" for c in spec.configurations)}
    left = {name: f"no configuration of the run moves data over {link.upper()}"
            for link, names in LINK_CONSTANTS.items() if not used[link] for name in names}
    if all(r.tp == 1 for c in spec.configurations for r in c.roles):
        left["allreduce_latency_us"] = "no role of the run is tensor-parallel: tp is 1 throughout"
    if not sends_images(spec):
        for name in ("image_preprocess_ms_per_mp", "measured_vision_factor", "vision_pass_ms"):
            left[name] = "no cell of the run sends images"
    elif not vision_measured(spec.model, spec.hardware):
        left["measured_vision_factor"] = ("the spec's vision tower follows the roofline laws, not the measured one "
                                          "it acts on")
    laws = law_sources(spec.model, spec.hardware, sends_images(spec))
    for name in LAW_CONSTANTS.keys() - laws:
        left.update({n: f"the spec's operators follow the {' and '.join(sorted(laws))} laws (hardware.op_laws), "
                        f"not the {name} ones it acts on" for n in LAW_CONSTANTS[name]})
    return [n for n in constants if n not in left], {n: why for n, why in left.items() if n in constants}


def spec_with(spec: ExperimentSpec, values: dict[str, float]) -> ExperimentSpec:
    """`spec` with hardware constants replaced (values already within BOUNDS)."""
    return spec.model_copy(update={"hardware": spec.hardware.model_copy(update=values)})


@dataclass
class FitResult:
    values: dict[str, float]        # the fitted constants (natural units)
    left: dict[str, str]            # constants left as in the spec: why
    start_loss: float               # loss with the spec's constants
    loss: float                     # loss with the fitted ones
    evaluations: int                # simulator runs this fit made (runs found in the shared cache not counted)
    start_predicted: pd.DataFrame   # predicted cells with the spec's constants
    predicted: pd.DataFrame         # predicted cells with the fitted constants
    effects: dict[str, float] = field(default_factory=dict)  # largest |log change| of a figure per probe


def pinned(values: dict[str, float]) -> dict[str, str]:
    """The fitted constants the search left at a bound it could not pass, as "upper" or "lower": an efficiency or
    a measured speed factor at either end (a run beyond the datasheet or ten times the measurement, or 20 times
    below it), any constant at its upper end. A latency at its lower end (1 µs) is a latency too small to
    matter, not a bound hit. Such a fit is the best the bounds allow, not a match: the units of the table, or a
    spec that is not the run's (GPU, model), are the usual cause."""
    out = {}
    for name, v in values.items():
        low, high = BOUNDS[name]
        if abs(math.log(v / high)) <= XTOL:
            out[name] = "upper"
        elif abs(math.log(v / low)) <= XTOL and name.endswith(("_efficiency", "_factor")):
            out[name] = "lower"
    return out


def snap(values: dict[str, float]) -> dict[str, float]:
    """Constants rounded to SNAP_DIGITS significant digits: the points the search evaluates, so that two runs of
    the same fit evaluate the same points and land on the same constants."""
    return {k: float(f"{v:.{SNAP_DIGITS}g}") for k, v in values.items()}


class _Evaluator:
    """Runs the predictor for a set of constants, at most `budget` times; predictions are kept in `cache`
    (shared between fits of the same spec), so a repeated point costs no run. The observed cells are narrowed
    to those of the first prediction (the cells the spec runs)."""

    def __init__(self, spec, observed, predict, budget, cache, on_evaluation):
        self.spec, self.observed, self.predict, self.budget = spec, observed, predict, budget
        self.cache = {} if cache is None else cache
        self.on_evaluation = on_evaluation
        self.count = 0
        self.narrowed = False
        self.best_loss = math.inf

    def predicted(self, values: dict[str, float], exact: bool = False) -> pd.DataFrame:
        """The prediction at `values` snapped to SNAP_DIGITS (`exact`: as given, for the spec's own constants)."""
        if not exact:
            values = snap(values)
        key = tuple(sorted(values.items()))
        fresh = key not in self.cache
        if fresh:
            if self.count >= self.budget:
                raise BudgetExhausted
            self.count += 1
            self.cache[key] = predicted_cells(self.predict(spec_with(self.spec, values)), list(self.observed.columns))
        if not self.narrowed:
            self.observed, self.narrowed = matched(self.observed, self.cache[key]), True
        if fresh:
            value = loss(self.observed, self.cache[key])
            self.best_loss = min(self.best_loss, value)
            if self.on_evaluation:
                self.on_evaluation(self.count, self.budget, value, self.best_loss)
        return self.cache[key]

    def residuals(self, values: dict[str, float]) -> np.ndarray:
        return residuals(self.observed, self.predicted(values))


def _scale(ev: _Evaluator, candidates: list[str], base: np.ndarray, lo: np.ndarray, hi: np.ndarray,
           reference: pd.DataFrame) -> dict[str, float]:
    """For each constant the spec sets to zero (at its lower bound, where log space has no scale and 10-fold
    is still nothing): 10-fold rungs up from it until one moves some figure of `reference` by MIN_EFFECT; its
    search starts where, in proportion, it would move one by MIN_EFFECT — the scale at which the run starts to
    show it (base, log space, is updated). A constant no rung moves keeps its bound (and is left: _probe
    finds no effect either). Returns {constant: largest |log change|}."""
    effects = {}
    for i, n in enumerate(candidates):
        if base[i] > lo[i] + 1e-9:
            continue
        effects[n] = 0.0
        for k in range(1, int((hi[i] - lo[i]) / math.log(WIDE_RATIO) + 1e-9) + 1):
            u = base.copy()
            u[i] += k * math.log(WIDE_RATIO)
            r = _log_ratios(reference, ev.predicted(dict(zip(candidates, np.exp(u).tolist()))))
            effects[n] = max(effects[n], float(np.nanmax(np.abs(r))) if np.isfinite(r).any() else 0.0)
            if effects[n] >= MIN_EFFECT:   # a latency adds time: the effect grows about in proportion to it
                base[i] = max(lo[i], u[i] + math.log(MIN_EFFECT / effects[n]))
                break
    return effects


def _probe(ev: _Evaluator, candidates: list[str], base: np.ndarray, hi: np.ndarray, reference: pd.DataFrame):
    """Move each constant alone from `base` (log space) by STEP_RATIO, or by WIDE_RATIO if that moved no figure
    of `reference` (the start's predictions) by MIN_EFFECT; down instead of up at the upper bound. Returns
    ({constant: probe point}, {constant: largest |log change| of a figure})."""
    vertices, effects = {}, {}
    for i, n in enumerate(candidates):
        for ratio in (STEP_RATIO, WIDE_RATIO):
            u = base.copy()
            u[i] += math.log(ratio) if base[i] + math.log(ratio) <= hi[i] else -math.log(ratio)
            r = _log_ratios(reference, ev.predicted(dict(zip(candidates, np.exp(u).tolist()))))
            effects[n] = float(np.nanmax(np.abs(r))) if np.isfinite(r).any() else 0.0
            if effects[n] >= MIN_EFFECT:
                break
        vertices[n] = u
    return vertices, effects


def fit_constants(spec: ExperimentSpec, observed: pd.DataFrame, predict: Callable[[ExperimentSpec], pd.DataFrame],
                  max_evaluations: int = 60, cache: dict | None = None,
                  on_evaluation: Callable[[int, int, float, float], None] | None = None,
                  constants: Sequence[str] = FREE_CONSTANTS) -> FitResult:
    """Fit those of `constants` (by default what a run's client figures can tell: FREE_CONSTANTS) that the
    observed cells identify. `observed`: observed_cells(...), restricted to the cells to fit. At most
    `max_evaluations` calls of `predict`; `on_evaluation(count, budget, loss, best loss)` after each.
    FitInputError when no observed cell is among the predicted ones, or the budget cannot even probe the
    constants."""
    candidates, left = structural_constants(spec, constants)
    if max_evaluations < len(candidates) + 1:
        raise FitInputError(f"at least {len(candidates) + 1} simulator runs are needed to probe "
                            f"{len(candidates)} constants (got {max_evaluations})")
    ev = _Evaluator(spec, observed, predict, max_evaluations, cache, on_evaluation)
    start = {n: float(np.clip(getattr(spec.hardware, n), *BOUNDS[n])) for n in candidates}
    p0 = ev.predicted(start, exact=True)
    observed = ev.observed
    if observed.empty:
        raise FitInputError("no observed cell matches a cell the spec runs (config, suite, workload, "
                            "concurrency, stream)")
    base = np.array([math.log(start[n]) for n in candidates])
    lo = np.array([math.log(BOUNDS[n][0]) for n in candidates])
    hi = np.array([math.log(BOUNDS[n][1]) for n in candidates])
    reference = p0.reindex(index=observed.index, columns=observed.columns).where(observed.notna())
    try:
        scaled = _scale(ev, candidates, base, lo, hi, reference)
        if scaled:   # probes are judged against the search's start
            at_base = ev.predicted(dict(zip(candidates, np.exp(base).tolist())))
            reference = at_base.reindex(index=observed.index, columns=observed.columns).where(observed.notna())
        vertices, effects = _probe(ev, candidates, base, hi, reference)
    except BudgetExhausted:
        raise FitInputError(f"{max_evaluations} simulator runs ran out while probing the constants; some need a "
                            f"wide probe: allow at least {2 * len(candidates) + 1} (more when the spec sets a "
                            f"latency to zero)") from None
    for n in candidates:
        if n in scaled and scaled[n] < MIN_EFFECT:
            left[n] = (f"the spec sets it to 0 and no value up to {BOUNDS[n][1]:g} moves an observed figure by "
                       f"{MIN_EFFECT:.0%} (at most {scaled[n]:.2%})")
        elif effects[n] < MIN_EFFECT:
            left[n] = (f"changing it {WIDE_RATIO:g}-fold moves no observed figure by {MIN_EFFECT:.0%} "
                       f"(at most {effects[n]:.2%})")
    fitted = [n for n in candidates if n not in left]
    values: dict[str, float] = {}
    if fitted:
        idx = [candidates.index(n) for n in fitted]
        fixed = {n: start[n] for n in candidates if n in left}

        def at(x: np.ndarray) -> dict[str, float]:
            return {**fixed, **dict(zip(fitted, np.exp(x).tolist()))}

        points = np.array([base[idx]] + [vertices[n][idx] for n in fitted])
        x, _ = least_squares_dfo(lambda x: ev.residuals(at(x)), points,
                                 np.array([ev.residuals(at(x)) for x in points]), lo[idx], hi[idx],
                                 radius=math.log(STEP_RATIO), xtol=XTOL, max_radius=math.log(WIDE_RATIO),
                                 grid=GRID)
        values = {n: v for n, v in snap(at(x)).items() if n in fitted}
    best = ev.predicted(at(x)) if fitted else p0          # the point the search evaluated (a cached run)
    return FitResult(values=values, left=left, start_loss=loss(observed, p0), loss=loss(observed, best),
                     evaluations=ev.count, start_predicted=p0, predicted=best, effects=effects)
