"""`epdbench plan` as text: one line per cell, then a legend of its columns and the total (pure)."""
from __future__ import annotations

from epdbench.analysis.labels import shape_label

LEGEND = ("columns:",
          "  stream   a mixed suite's stream (steady or burst, sent side by side in one window); main elsewhere",
          "  warm     warm-up requests per trial, sent first and not measured",
          "  meas     measured requests per trial",
          "  prompts  fingerprint of the cell's prompts: the same for every configuration (matched workloads)",
          "  est s    estimated seconds of the cell, all trials")


def total_line(cells: int, trials: int, total_s: float, virtual: bool = False) -> str:
    """The plan's last line: how long the run takes on the simulator, or, in virtual time, that it takes seconds and
    how long the same spec would take on simulator processes."""
    if virtual:
        return (f"{cells} cells × {trials} trial(s) in virtual time: seconds of simulation, then the report and "
                "MLflow (about a minute on 2 cores); on simulator processes (--clock real) an estimated "
                f"{total_s / 60:.1f} min")
    return (f"{cells} cells × {trials} trial(s); estimated {total_s / 60:.1f} min on the simulator (cost model; real "
            "hardware differs)")


def plan_lines(rows: list[dict], trials: int, total_s: float, virtual: bool = False) -> list[str]:
    width = max([len("load"), *(len(r["load"]) for r in rows)])
    lines = [f"{'config':<12} {'suite':<12} {'workload':<22} {'load':<{width}} {'stream':<14} {'warm':>4} "
             f"{'meas':>5} {'prompts':<16} {'est s':>7}"]
    lines += [f"{r['config']:<12} {r['suite']:<12} {shape_label(r['workload']):<22} {r['load']:<{width}} "
              f"{r['stream']:<14} {r['n_warmup']:>4} {r['n_measured']:>5} {r['prompt_set_hash']:<16} "
              f"{r['est_seconds']:>7.1f}" for r in rows]
    return [*lines, *LEGEND, total_line(len(rows), trials, total_s, virtual)]
