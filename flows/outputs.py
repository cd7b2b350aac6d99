"""What a finished comparison shows: each configuration's verdicts for the report, the report's metadata
and the Markdown artifact that ends a flow run in the Prefect UI."""
from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from epdbench.analysis.labels import load_label, shape_label
from epdbench.analysis.prom import cache_by_role
from epdbench.analysis.ucx import remote_lanes
from epdbench.reports.findings import regression_line
from epdbench.reports.verdict import contamination_line
from epdbench.specs.commands import ec_path
from epdbench.specs.models import ExperimentSpec
from epdbench.tasks.publishing.publish import roles_text

if TYPE_CHECKING:
    from epdbench.flows.compare import ConfigOutcome


def prefect_summary_artifact(outcome: dict, summary) -> None:
    """The Markdown artifact that ends a flow run in the Prefect UI: headline table, verdicts, MLflow link."""
    try:
        from prefect.artifacts import create_markdown_artifact
    except ImportError:
        return
    lines = [f"# epdbench {outcome['run']}", ""]
    url = outcome.get("mlflow_url")
    if url:      # a local store's is the `mlflow ui` command and the address it serves: no link of its own
        run = f"[{outcome['mlflow_run_id']}]({url})" if url.startswith("http") else f"`{url}`"
        lines += [f"MLflow comparison run: {run}", ""]
    lines += ["| configuration | ok | transport | stages |", "|---|---|---|---|"]
    lines += [f"| {n} | {'yes' if c['ok'] else 'FAILED: ' + (c['error'] or '')} | {c['transport']} | {c['stages']} |"
              for n, c in outcome["configs"].items()]
    if not summary.empty:
        lines += ["", "| config | suite | workload | load | stream | ok | TTFT p50 ms | ITL p99 ms | tok/s |",
                  "|---|---|---|---|---|---:|---:|---:|---:|"]
        for _, r in summary.iterrows():
            def f(v):
                return "—" if v is None else f"{float(v):.1f}"
            lines.append(f"| {r['config']} | {r['suite']} | {shape_label(r['workload'])} | "
                         f"{load_label(r['workload'], r['concurrency'])} | {r['stream']} | "
                         f"{r['requests_ok']}/{r['requests_total']} | {f(r['ttft_p50_ms'])} | {f(r['itl_p99_ms'])} | "
                         f"{f(r['output_tok_s'])} |")
    spoilt = contamination_line(summary, outcome.get("meta") or {})
    lines += [""] + ([spoilt, ""] if spoilt else []) + [regression_line(outcome.get("regression")), ""]
    if outcome.get("winners"):
        lines += ["```", *outcome["winners"], "```", ""]
    lines += [f"Results: `{outcome['results_dir']}`"]
    try:
        create_markdown_artifact("\n".join(lines), key="epdbench-report", description=f"epdbench {outcome['run']}")
    except Exception:  # noqa: BLE001 - outside a flow run context
        pass


def verdict_view(o: ConfigOutcome) -> dict:
    """What the report shows of a configuration's evidence (JSON-able)."""
    t, st = o.transport, o.stages
    pods = t.get("pods", {})
    ec = t.get("ec") or {}
    return {
        "transport": t.get("verdict", "not run"), "transport_reasons": t.get("reasons", [o.error or ""]),
        "connector": t.get("connector", "mooncake"),
        "ec_transport": ec.get("verdict"), "ec_reasons": ec.get("reasons", []),
        "workers": worker_view(t), "ec_workers": worker_view(ec),
        "stages": st.get("verdict", "not run"), "stage_reasons": st.get("reasons", [o.error or ""]),
        "fraction_seen": st.get("fraction_seen", {}),
        "observed": {n: p.get("observed") for n, p in pods.items()},
        "rdma_devices": sorted({f"{d['name']} (LID {d['lid']})" for p in pods.values() for d in p["rdma_devices"]}),
        "throughput_mb_s_min": t.get("throughput_mb_s_min"), "throughput_mb_s_max": t.get("throughput_mb_s_max"),
        "failed_transfers": t.get("failed_transfers"), "failed_recvs": t.get("failed_recvs"),
        "per_role": st.get("per_role", {}),
        "suites": {name: {"verdict": s["verdict"], "fraction_seen": s["fraction_seen"],
                          "kv_bytes": sum(d.get("mooncake_bytes_transferred", 0) if r == "prefill" else
                                          d.get("nixl_bytes_transferred", 0) if r == "decode" else 0
                                          for r, d in s["metrics_delta"].items()),
                          "cache": cache_by_role(s["metrics_delta"])}
                   for name, s in st.get("suites", {}).items()},
    }


def worker_view(t: dict) -> list[str]:
    """One line per pod and worker of a verdict: what it installed (Mooncake) or which lanes UCX chose (NIXL)."""
    out = []
    for name, pod in sorted((t.get("pods") or {}).items()):
        for wname, w in sorted(pod.get("workers", {}).items()):
            if "configs" in w:
                lanes = sorted({f"{x['tl']}/{x['device']}" for x in remote_lanes(w)})
                out.append(f"{name} {wname}: UCX {w['observed'] or '?'} ({', '.join(lanes) or 'no remote lanes'})")
            else:
                out.append(f"{name} {wname}: Mooncake {w.get('observed') or '?'}")
    return out


def report_meta(spec: ExperimentSpec, run: str, outcomes: dict[str, ConfigOutcome]) -> dict:
    target = ("simulator in virtual time (emulated hardware)" if spec.virtual else
              "simulator (emulated hardware)" if spec.target.kind == "sim" else
              f"local vLLM engines ({spec.target.local.device.upper()})" if spec.target.kind == "local" else
              "Kubernetes")
    return {
        "title": f"epdbench: {spec.name} on {target}",
        "run": run, "spec": spec.name, "target": spec.target.kind, "model": spec.model.name,
        "clock": "virtual" if spec.virtual else "real",
        "hardware": f"{spec.hardware.gpu} figures", "seed": spec.seed, "trials": spec.trials,
        "time_scale": spec.time_scale,
        "client": ("loopback" if spec.target.kind in ("sim", "local") else "in-cluster"
                   if spec.target.kubernetes.loadgen.run_in == "cluster" else spec.target.kubernetes.access),
        "client_placement": spec.target.kubernetes.loadgen.placement if spec.target.kind == "kubernetes" else None,
        "device": spec.target.local.device if spec.target.kind == "local" else None,
        "tiny_model": spec.target.kind == "local" and spec.target.local.made_model == "tiny",
        "model_files": spec.target.local.made_model if spec.target.kind == "local" else None,
        "gpu_share": spec.shares_one_gpu,
        "gpu_budget": spec.cost.gpu_budget,        # with each configuration's budget_scale: reports.footing
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "configurations": [{"name": c.name, "topology": c.topology, "roles": roles_text(c), "gpus": spec.gpus_used(c),
                            "budget_scale": spec.cost.budget_scale(c.name),
                            "transport": c.kv_transport,
                            "connector": "none" if c.topology == "aggregated" else c.kv_connector,
                            "ec_transport": ec_path(spec, c),
                            "router": outcomes[c.name].router if c.name in outcomes else ""}
                           for c in spec.configurations],
        "failures": {n: o.error for n, o in outcomes.items() if o.error},
        "reuse_suites": [s.name for s in spec.suites if getattr(s, "reuse_image", False)],
        "load": {s.name: s.load_text() for s in spec.suites},
    }
