"""The GPU footing a verdict stands on (pure): one sentence saying on how many GPUs each configuration ran — all on
the same count, scaled to a GPU budget (cost.gpu_budget, `compare --gpu-budget`; specs.budget), unequal, or all on
one shared GPU (target.local.gpu_share). The report's Verdict, the terminal's closing lines and the MLflow
comparison run (tag epdbench.gpu_footing) carry it.

Read from the report's metadata (flows.outputs.report_meta): each configuration's name, the GPUs it ran on and
the factor the budget multiplied its replicas by (`budget_scale`; absent in runs before budgets: 1), the budget
(`gpu_budget`) and whether the engines shared one GPU (`gpu_share`)."""
from __future__ import annotations

HOW_TO_EQUALISE = "set cost.gpu_budget or --gpu-budget to compare at an equal budget"


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' * (n != 1)}"


def gpu_footing(meta: dict) -> str | None:
    """The sentence (None without configurations), e.g. "GPU budget 4: aggregated ×4 replicas (4 GPUs), pd-tcp ×2
    (4), epd as written (3); epd uses 3 of 4." or "Every configuration on 6 GPUs."."""
    configs = meta.get("configurations") or []
    if not configs:
        return None
    if meta.get("gpu_share"):
        return ("Every configuration on one shared GPU (target.local.gpu_share): PD and EPD ran their roles side by "
                "side on its compute and memory.")
    budget = meta.get("gpu_budget")
    if budget:
        return _budget_sentence(configs, budget)
    counts = [c["gpus"] for c in configs]
    if len(set(counts)) == 1:
        return f"Every configuration on {_gpus(counts[0])}."
    listing = ", ".join(f"{c['name']} {c['gpus']}" for c in configs)
    return (f"Unequal GPU counts ({listing}): throughput per GPU is normalised, latency compares deployments of "
            f"different sizes — {HOW_TO_EQUALISE}.")


def _budget_sentence(configs: list[dict], budget: int) -> str:
    """GPU budget B: each configuration ×k (its GPUs), the first scaled one saying "replicas" and the first one
    "GPUs"; then those that leave part of the budget unused."""
    parts, said_replicas = [], False
    for i, c in enumerate(configs):
        k = c.get("budget_scale") or 1
        gpus = _gpus(c["gpus"]) if i == 0 else str(c["gpus"])
        if k == 1:
            parts.append(f"{c['name']} as written ({gpus})")
        else:
            parts.append(f"{c['name']} ×{k}{'' if said_replicas else ' replicas'} ({gpus})")
            said_replicas = True
    short = [f"{c['name']} uses {c['gpus']} of {budget}" for c in configs if c["gpus"] < budget]
    return f"GPU budget {budget}: {', '.join(parts)}" + (f"; {', '.join(short)}." if short else ".")
