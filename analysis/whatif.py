"""What-if planning (pure): the deployment variants to try, the search for the highest rate each sustains
within the SLO, and the capacity table.

A variant is one of the spec's configurations with other replica counts and TP per role (and, asked for, the
other KV transport), within one node's GPUs. Its capacity is DistServe's goodput: the highest Poisson rate at
which the share of requests meeting every SLO bound stays at or above the target — found by walking the
suite's swept rates upwards until one fails (doubling past the highest while all hold), then bisecting
between the last rate held and the first that failed. The table gives, per configuration, the variant with the
best goodput per GPU.

Every rate's verdict carries its noise (analysis.goodput's rules): a rate *surely* holds when its attainment's
95% Wilson interval lies at or above the target and its ITL p99's interval within the bound, and *surely*
fails when either lies wholly on the wrong side. A capacity is the point-estimate goodput with its noise
range — from the highest rate surely held (with every lower rate tried) to the lowest surely failed — and one
configuration beats another only when it surely holds a rate per GPU at which the other surely fails; else the
two are a tie.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from epdbench.analysis.goodput import surely
from epdbench.physics.costmodel import CostModel
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, RateSuite

MAX_DOUBLINGS = 4        # past the highest swept rate: at most 16× it (below the lowest: 1/16 of it)
SURE_STEPS = 4           # ×√2 steps past a verdict within noise, for one beyond it: at most 4× (¼) that rate
CAPACITY_COLUMNS = ["configuration", "variant", "roles", "kv_transport", "gpus", "goodput_req_s",
                    "goodput_req_s_per_gpu", "fails_at_req_s", "holds_surely_req_s", "fails_surely_req_s",
                    "attainment", "tie_with", "variants_within_noise", "note"]


@dataclass(frozen=True)
class Variant:
    family: str                   # the spec configuration it varies (or <topology>-<transport> for another transport)
    config: ConfigurationSpec

    @property
    def roles(self) -> str:
        """e.g. prefill 1×TP2 + decode 2×TP2."""
        return " + ".join(f"{r.role} {r.replicas}×TP{r.tp}" for r in self.config.roles)


def _role_label(role: str) -> str:
    return {"server": "s", "prefill": "p", "decode": "d", "encode": "e"}[role]


def tp_problem(spec: ExperimentSpec, tp: int) -> str | None:
    """Why vLLM would not serve the spec's model on an engine of `tp` GPUs, or None: a TP its heads do not
    allow (specs.node.ModelSpec.tp_problem), or an engine that refuses to start, its KV cache unable to hold one
    max_model_len sequence (physics.costmodel.CostModel.start_problem)."""
    if why := spec.model.tp_problem(tp):
        return why
    return CostModel(spec.model, spec.hardware, tp=tp).start_problem(spec.engine)


def variants(spec: ExperimentSpec, replicas: list[int], tps: list[int] | None = None,
             transports: list[str] | None = None, max_gpus: int | None = None,
             over: list[int] | None = None) -> list[Variant]:
    """Every spec configuration with each role's replicas from `replicas` and TP from `tps` (default: the TP
    values the spec's configurations use; a TP vLLM would not serve the model on is never tried, tp_problem),
    on at most `max_gpus` GPUs (default: one node); for PD and EPD also with each KV transport of `transports`
    the spec does not already have as a configuration of the same topology. The spec's own configurations are
    included when they fit. `over` (if given) gets the GPU count of every combination left out for needing more
    than `max_gpus`."""
    if max_gpus is not None and max_gpus > spec.hardware.gpus_per_node:
        raise ValueError(f"max_gpus {max_gpus} is over the node's {spec.hardware.gpus_per_node}: the simulator "
                         "models one node")
    max_gpus = max_gpus or spec.hardware.gpus_per_node
    own = {r.tp for c in spec.configurations for r in c.roles}
    refused = {t: tp_problem(spec, t) is not None for t in set(tps or []) | own}     # once per TP, not per shape
    tps = sorted(t for t in set(tps or own) if not refused[t])
    have = {(c.topology, c.kv_transport) for c in spec.configurations}
    out: list[Variant] = []
    seen: set[tuple] = set()
    for base in spec.configurations:
        families = [(base.name, base.kv_transport)]
        for t in transports or []:
            if base.topology != "aggregated" and t != base.kv_transport and (base.topology, t) not in have:
                families.append((f"{base.topology}-{t}", t))
                have.add((base.topology, t))
        for family, transport in families:
            options = [[(n, tp) for n in sorted(set(replicas)) for tp in tps] for _ in base.roles]
            shapes = [tuple((r.replicas, r.tp) for r in base.roles)] + list(itertools.product(*options))
            for shape in shapes:
                roles = [r.model_copy(update={"replicas": n, "tp": tp,
                                              "rdma_interfaces": max(1, r.rdma_interfaces) if transport == "rdma"
                                              and r.role in ("prefill", "decode") else r.rdma_interfaces})
                         for r, (n, tp) in zip(base.roles, shape)]
                key = (family, tuple((r.role, r.replicas, r.tp) for r in roles))
                if key in seen or any(refused[r.tp] for r in roles):
                    continue
                if (gpus := sum(r.replicas * r.tp for r in roles)) > max_gpus:
                    if over is not None:
                        over.append(gpus)
                    seen.add(key)
                    continue
                seen.add(key)
                name = f"{family}-" + "-".join(f"{_role_label(r.role)}{r.replicas}x{r.tp}" for r in roles)
                out.append(Variant(family, base.model_copy(update={"name": name[:41].rstrip("-"),
                                                                   "kv_transport": transport, "roles": roles})))
    return out


@dataclass(frozen=True)
class Point:
    rate: float
    requests: int
    met: int
    target: float
    itl_p99_ms: float | None = None     # the rate's pooled ITL p99, when the SLO bounds it
    itl_p99_holds: bool = True          # ... within slo.itl_p99_ms (analysis.goodput.itl_p99)
    itl_p99_uncertain: bool = False     # ... the bound inside the p99's 95% interval

    @property
    def attainment(self) -> float:
        return self.met / self.requests if self.requests else 0.0

    @property
    def sustained(self) -> bool:
        """The point estimate: attainment at or above the target and the ITL p99 within its bound."""
        return self.requests > 0 and self.attainment >= self.target and self.itl_p99_holds

    @property
    def verdict(self) -> bool | None:
        """Beyond the noise (analysis.goodput.surely): True held, False failed, None within the noise."""
        return surely(self.met, self.requests, self.target, self.itl_p99_holds, self.itl_p99_uncertain)

    @property
    def surely_holds(self) -> bool:
        return self.verdict is True

    @property
    def surely_fails(self) -> bool:
        return self.verdict is False

    @property
    def uncertain(self) -> bool:
        return self.verdict is None


def _upwards(rates: list[float]):
    """The swept rates in order, then doubling past the highest."""
    yield from sorted(rates)
    r = max(rates)
    for _ in range(MAX_DOUBLINGS):
        r *= 2
        yield r


def search_rate(evaluate: Callable[[float], Point], rates: list[float], refine: int = 3) -> list[Point]:
    """Points evaluated, in order: the swept rates upwards until one fails (then doubling past the highest
    while all hold, at most MAX_DOUBLINGS times) — or, when the lowest already fails, halving below it until one
    holds (at most MAX_DOUBLINGS times) — then `refine` bisections (geometric) between the highest rate
    sustained and the lowest that failed. When no rate tried surely fails, rates above the highest tried
    (×√2 each, at most SURE_STEPS) until one does: the noise range's upper end (capacity_row); when the lowest
    tried held but within noise, rates below it (÷√2 each, at most SURE_STEPS) until one surely holds: its
    lower end."""
    points: list[Point] = []
    best = upper = None
    for r in _upwards(rates):
        p = evaluate(r)
        points.append(p)
        if not p.sustained:
            upper = r
            break
        best = r
    if best is None and upper is not None:
        r = upper
        for _ in range(MAX_DOUBLINGS):
            r /= 2
            p = evaluate(r)
            points.append(p)
            if p.sustained:
                best = r
                break
            upper = r
    if best is not None and upper is not None:
        for _ in range(refine):
            mid = math.sqrt(best * upper)
            p = evaluate(mid)
            points.append(p)
            best, upper = (mid, upper) if p.sustained else (best, mid)
    if upper is not None and not any(p.surely_fails for p in points):
        # the failure found is within noise: bound the range from above
        _step_until(evaluate, points, max(p.rate for p in points), math.sqrt(2), False)
    lowest = min(points, key=lambda p: p.rate) if points else None
    if best is not None and lowest is not None and lowest.sustained and not lowest.surely_holds:
        _step_until(evaluate, points, lowest.rate, 1 / math.sqrt(2), True)   # held within noise: from below
    return points


def _step_until(evaluate: Callable[[float], Point], points: list[Point], rate: float, factor: float,
                verdict: bool) -> None:
    """Rates rate×factor, rate×factor², … (at most SURE_STEPS) appended to `points` until one's verdict beyond
    the noise is `verdict`."""
    for _ in range(SURE_STEPS):
        rate *= factor
        p = evaluate(rate)
        points.append(p)
        if p.verdict is verdict:
            return


def capacity_row(variant: Variant, points: list[Point]) -> dict:
    """A variant's goodput: the highest rate sustained with every lower evaluated rate sustained too; its noise
    range: the highest rate surely held with every lower one surely held too, and the lowest surely failed."""
    ordered = sorted(points, key=lambda p: p.rate)
    best = fails = att = None
    for p in ordered:
        if not p.sustained:
            fails = p.rate
            break
        best, att = p.rate, p.attainment
    holds_surely = None
    for p in ordered:
        if not p.surely_holds:
            break
        holds_surely = p.rate
    fails_surely = next((p.rate for p in ordered if p.surely_fails), None)
    gpus = variant.config.gpus
    note = ("" if fails is not None else "every rate tried held: at least this" if best is not None
            else "none")
    if best is None and points:
        note = f"fails at the lowest rate tried ({ordered[0].rate:g} req/s)"
    blurred = [p.rate for p in ordered if p.uncertain]
    if blurred:
        note = ((note + "; " if note else "") + "too close to the SLO to call at "
                + ", ".join(f"{r:.3g}" for r in blurred) + " req/s")
    return {"configuration": variant.family, "variant": variant.config.name, "roles": variant.roles,
            "kv_transport": variant.config.kv_transport, "gpus": gpus, "goodput_req_s": best,
            "goodput_req_s_per_gpu": best / gpus if best is not None else None, "fails_at_req_s": fails,
            "holds_surely_req_s": holds_surely, "fails_surely_req_s": fails_surely, "attainment": att,
            "tie_with": "", "variants_within_noise": "", "note": note}


def _figure(row: dict, key: str) -> float | None:
    """row[key], None when missing or NaN (a table read back from CSV)."""
    v = row.get(key)
    return None if v is None or v != v else v


def _per_gpu(row: dict, key: str) -> float | None:
    v = _figure(row, key)
    return None if v is None else v / row["gpus"]


def surely_beats(a: dict, b: dict) -> bool:
    """Whether capacity row `a` surely holds a rate per GPU at which `b` surely fails."""
    held, failed = _per_gpu(a, "holds_surely_req_s"), _per_gpu(b, "fails_surely_req_s")
    return held is not None and failed is not None and held >= failed


def best_per_configuration(rows: list[dict]) -> list[dict]:
    """Per configuration, the variant with the highest goodput per GPU (equal: fewer GPUs, then the name),
    best first; each row's `tie_with` names the configurations neither beats nor is beaten by beyond the noise
    (surely_beats), `variants_within_noise` the other variants of its configuration it does not surely beat
    (their roles), and its note says both."""
    out: dict[str, dict] = {}
    for r in rows:
        cur = out.get(r["configuration"])
        key = (r["goodput_req_s_per_gpu"] or 0.0, -r["gpus"], r["variant"])
        if cur is None or key > (cur["goodput_req_s_per_gpu"] or 0.0, -cur["gpus"], cur["variant"]):
            out[r["configuration"]] = r
    best = [dict(r) for r in sorted(out.values(), key=lambda r: -(r["goodput_req_s_per_gpu"] or 0.0))]
    for r in best:
        ties = [o["configuration"] for o in best if o is not r and not surely_beats(r, o) and not surely_beats(o, r)]
        r["tie_with"] = ", ".join(ties)
        rivals = [o["roles"] for o in rows if o["configuration"] == r["configuration"]
                  and o["variant"] != r["variant"] and not surely_beats(r, o)]
        r["variants_within_noise"] = "; ".join(rivals)
        notes = ([f"tied with {r['tie_with']} (neither surely better)"] if ties else []) + \
            ([f"{len(rivals)} other variant{'s' if len(rivals) > 1 else ''} may do as well"] if rivals else []) + \
            ([r["note"]] if r["note"] else [])
        r["note"] = "; ".join(notes)
    return best


def slo_suites(spec: ExperimentSpec) -> list[RateSuite]:
    """The spec's open-loop suites with an SLO: what capacity is planned for."""
    return [s for s in spec.suites if isinstance(s, RateSuite) and s.slo is not None]


TABLE_LEGEND = ("noise range: from the highest rate surely held to the lowest surely failed; surely: the SLO's "
                "attainment (and ITL p99) clear of its target beyond the sampling noise of the requests measured "
                "(95 % interval), where a rate closer than that is too close to call. One configuration beats "
                "another only when it surely holds a rate per GPU at which the other surely fails; else they are "
                "tied, and other variants of a configuration that the best does not surely beat may do as well "
                "(capacity.csv names them).")


def table_lines(rows: list[dict]) -> list[str]:
    """The capacity table as aligned text lines (columns as wide as their longest entry)."""
    wc = max([len("configuration")] + [len(r["configuration"]) for r in rows])
    wr = max([len("best variant")] + [len(r["roles"]) for r in rows])
    fmt = lambda v: "—" if v is None or v != v else f"{v:.3g}"   # noqa: E731  (None or NaN: no figure)
    ranges = [noise_range(r) for r in rows]
    wn = max([len("noise range")] + [len(x) for x in ranges])
    head = (f"{'configuration':<{wc}} {'best variant':<{wr}} {'GPUs':>4} {'req/s':>8} {'noise range':>{wn}} "
            f"{'per GPU':>8} {'fails at':>9}  note")
    lines = [head, "-" * len(head)]
    for r, span in zip(rows, ranges):
        lines.append(f"{r['configuration']:<{wc}} {r['roles']:<{wr}} {r['gpus']:>4} {fmt(r['goodput_req_s']):>8} "
                     f"{span:>{wn}} {fmt(r['goodput_req_s_per_gpu']):>8} {fmt(r['fails_at_req_s']):>9}  "
                     f"{r['note']}".rstrip())
    return lines


def noise_range(row: dict) -> str:
    """A capacity's noise range in words: "<highest rate surely held>–<lowest surely failed>" in req/s, an end
    unknown when no rate tried was sure ("<" or "≥")."""
    low, high = _figure(row, "holds_surely_req_s"), _figure(row, "fails_surely_req_s")
    if low is None and high is None:
        return "?"
    if low is None:
        return f"< {high:.3g}"
    if high is None:
        return f"≥ {low:.3g}"
    return f"{low:.3g}–{high:.3g}"
