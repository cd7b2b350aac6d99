"""Equal-GPU-budget comparisons (pure): with a GPU budget (cost.gpu_budget, or `compare --gpu-budget`), every
configuration is deployed with each role's replicas multiplied by k = floor(budget / its GPUs), so each runs on
k × its GPUs ≤ the budget and is measured at that size, not projected to it.

The resolved spec carries the scaled configurations — what every target deploys, what spec.yaml holds and what
the fingerprint covers — and, in cost.budget_scales, each configuration's GPUs as written and its k, so the report
can say what was done. Resolving is idempotent: a resolved spec (a run's spec.yaml, read again by --resume, the
load generator or a re-render) is taken back to its configurations as written and scaled again, to the same
result.
"""
from __future__ import annotations

from dataclasses import dataclass

from epdbench.specs.cost import BudgetScale
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, SpecError, parse_spec
from epdbench.specs.topology import MAX_REPLICAS


@dataclass(frozen=True)
class Scaling:
    """What a budget did: the configurations to deploy and, per configuration, its GPUs as written and k."""
    configurations: list[ConfigurationSpec]
    scales: list[BudgetScale]


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' * (n != 1)}"


def scaled(config: ConfigurationSpec, k: int) -> ConfigurationSpec:
    """`config` with every role's replicas multiplied by k."""
    return config.model_copy(update={"roles": [r.model_copy(update={"replicas": r.replicas * k})
                                               for r in config.roles]})


def scale_to_budget(configurations: list[ConfigurationSpec], budget: int, gpus_per_node: int,
                    gpu_share: bool = False, shares_one_gpu: bool = False, where: str | None = None) -> Scaling:
    """Every configuration scaled to `budget` GPUs (k = floor(budget / its GPUs)). `gpu_share`: the spec's
    target.local.gpu_share (its node may have fewer GPUs than a configuration, as the spec's own check allows);
    `shares_one_gpu`: that on the local target, where every configuration counts one GPU and a budget is refused.
    `where` names the budget in errors (default the spec's field; the command line's flag when it came from
    there). Raises SpecError, one line naming the fix, when the budget cannot hold a configuration once, exceeds
    the node, or would give a role more than MAX_REPLICAS replicas."""
    where = where or f"field 'cost.gpu_budget' ({budget})"
    if shares_one_gpu:
        raise SpecError(f"{where}: target.local.gpu_share runs every engine of a configuration on one GPU, so each "
                        "configuration counts one GPU and a budget has nothing to scale: drop the budget, or set "
                        "target.local.gpu_share false to give every engine its own GPU")
    if budget > gpus_per_node and not gpu_share:
        raise SpecError(f"{where} exceeds 'hardware.gpus_per_node' ({gpus_per_node}): a configuration runs on one "
                        f"node; give a budget of at most {gpus_per_node}, or a bigger node")
    over = [c for c in configurations if c.gpus > budget]
    if over:
        need = max(c.gpus for c in over)
        names = ", ".join(f"{c.name} ({c.gpus})" for c in over)
        raise SpecError(f"{where}: {names} need{'s' * (len(over) == 1)} more GPUs than the budget, so cannot run "
                        f"even once: give a budget of at least {need}, or leave "
                        f"{'it' if len(over) == 1 else 'them'} out (--configs)")
    out, scales = [], []
    for c in configurations:
        k = budget // c.gpus
        most = max(r.replicas for r in c.roles)
        if most * k > MAX_REPLICAS:
            fits = (MAX_REPLICAS // most + 1) * c.gpus - 1
            raise SpecError(f"{where}: {c.name} ×{k} would run {most * k} replicas of one role, more than the "
                            f"{MAX_REPLICAS} a role may have: give a budget of at most {fits}")
        out.append(scaled(c, k))
        scales.append(BudgetScale(configuration=c.name, gpus=c.gpus, scale=k))
    return Scaling(out, scales)


def as_written(spec: ExperimentSpec) -> list[ConfigurationSpec]:
    """The spec's configurations as the user wrote them: a resolved spec's scaled ones divided by their k
    (cost.budget_scales); SpecError when a configuration does not read as a scaling of one."""
    if not spec.cost.budget_scales:
        return list(spec.configurations)
    scale = {s.configuration: s for s in spec.cost.budget_scales}
    out = []
    for c in spec.configurations:
        s = scale.get(c.name)
        if s is None or c.gpus != s.gpus * s.scale or any(r.replicas % s.scale for r in c.roles):
            what = "not in it" if s is None else f"not {_gpus(s.gpus)} ×{s.scale}"
            raise SpecError(f"field 'cost.budget_scales': configuration {c.name} is {what}: drop budget_scales "
                            "(epdbench writes it) and give the configurations as written")
        out.append(c.model_copy(update={"roles": [r.model_copy(update={"replicas": r.replicas // s.scale})
                                                  for r in c.roles]}))
    return out


def resolve_gpu_budget(spec: ExperimentSpec, budget: int | None = None, flag: str | None = None) -> ExperimentSpec:
    """`spec` with its GPU budget applied: `budget` (given on the command line as `flag`) when not None, else
    cost.gpu_budget; the configurations scaled from those as written, cost.budget_scales saying how. Without a
    budget the spec comes back as it is. Idempotent. SpecError (one line) when the budget does not fit."""
    if budget is None and spec.cost.gpu_budget is None:
        return spec
    where = f"{flag} {budget}" if flag and budget is not None else None
    budget = spec.cost.gpu_budget if budget is None else budget
    where = where or f"field 'cost.gpu_budget' ({budget})"
    if budget < 1:
        raise SpecError(f"{where}: give the GPUs every configuration may use, 1 or more (e.g. 6)")
    scaling = scale_to_budget(as_written(spec), budget, spec.hardware.gpus_per_node, spec.target.local.gpu_share,
                              spec.shares_one_gpu, where)
    cost = spec.cost.model_copy(update={"gpu_budget": budget, "budget_scales": scaling.scales})
    if cost == spec.cost and scaling.configurations == list(spec.configurations):
        return spec
    data = spec.model_dump(mode="json")
    data["configurations"] = [c.model_dump(mode="json") for c in scaling.configurations]
    data["cost"] = cost.model_dump(mode="json")
    return parse_spec(data, flag or "spec")
