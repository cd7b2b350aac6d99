"""epdbench command line. Bad input gets one line naming the field and the fix, and exit code 2.

Exit codes of `compare`: 0 all configurations ran and their evidence holds (verified, or emulated
on the simulator); 2 bad input; 3 completed with failures or unverified evidence.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_BAD_INPUT, EXIT_FAILURES = 0, 2, 3


def quiet_defaults() -> None:
    """Telemetry off and a start-up timeout that fits small machines, unless the user set them."""
    for k, v in {
        "DO_NOT_TRACK": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
        "GIT_PYTHON_REFRESH": "quiet",
    }.items():
        os.environ.setdefault(k, v)


class CliError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise CliError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="epdbench", description="Compare aggregated, PD and EPD LLM serving on matched workloads.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    c = sub.add_parser("compare", help="run the comparison (main job)")
    c.add_argument("--spec", default="smoke", help="spec YAML path or preset name (default: smoke)")
    c.add_argument("--target", choices=["sim", "kubernetes"], default=None, help="where to run (default: spec's, sim)")
    c.add_argument("--configs", default=None, help="comma-separated configuration names (default: all)")
    c.add_argument("--out", default=None, help="results directory (default: results/<run>)")
    c.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: sqlite under .epdbench/)")
    c.add_argument("--experiment", default=None, help="MLflow experiment name (default: spec's, epdbench)")
    c.add_argument("--seed", type=int, default=None, help="override the spec's seed")

    r = sub.add_parser("report", help="re-render report.md from a results directory")
    r.add_argument("results_dir")

    v = sub.add_parser("verify-transport", help="which KV transport did these pod logs really use?")
    v.add_argument("logs", nargs="+", help="one log file per KV pod (Prefill and Decode)")
    v.add_argument("--expect", required=True, choices=["tcp", "rdma"], help="the transport the deployment asked for")
    v.add_argument("--json", action="store_true", help="print transport.json instead of text")

    s = sub.add_parser("sim", help="serve one simulated role replica (used by the sim target)")
    s.add_argument("args", nargs=argparse.REMAINDER)
    return p


def load_compare_spec(args):
    from specs.models import SpecError, load_spec, select_configurations

    spec = load_spec(args.spec)
    if args.target == "kubernetes":
        raise SpecError("--target kubernetes: the Kubernetes target is not available in this version; use --target sim")
    updates: dict = {}
    if args.seed is not None:
        if args.seed < 0:
            raise SpecError("--seed: must be >= 0")
        updates["seed"] = args.seed
    tracking = spec.tracking
    if args.experiment:
        tracking = tracking.model_copy(update={"experiment": args.experiment})
    if args.tracking_uri:
        tracking = tracking.model_copy(update={"tracking_uri": args.tracking_uri})
    updates["tracking"] = tracking
    spec = spec.model_copy(update=updates)
    configs = [x.strip() for x in args.configs.split(",") if x.strip()] if args.configs else None
    return select_configurations(spec, configs)


def cmd_compare(args) -> int:
    spec = load_compare_spec(args)
    if args.out and Path(args.out).exists() and any(Path(args.out).iterdir()):
        raise CliError(f"--out {args.out}: directory exists and is not empty; choose a new one")
    quiet_defaults()
    from flows.compare import compare
    from reports.terminal import print_summary

    outcome = compare(spec, out_dir=args.out, tracking_uri=args.tracking_uri, trigger="cli")
    print_summary(outcome)
    return EXIT_OK if outcome["all_verified"] else EXIT_FAILURES


def cmd_report(args) -> int:
    import json

    from analysis.metrics import summarize
    from reports.render import render_report
    from tasks.results import read_records

    rdir = Path(args.results_dir)
    if not (rdir / "records.parquet").exists() or not (rdir / "outcome.json").exists():
        raise CliError(f"{rdir}: no records.parquet/outcome.json here; give a results directory written by "
                       "'epdbench compare'")
    outcome = json.loads((rdir / "outcome.json").read_text())
    summary = summarize(read_records(rdir / "records.parquet"))
    (rdir / "report.md").write_text(render_report(outcome["meta"], summary, outcome["verdicts"]))
    print(rdir / "report.md")
    return EXIT_OK


def cmd_verify_transport(args) -> int:
    """Exit 0 only when the logs prove the expected transport carried the KV."""
    import json

    from analysis.evidence import transport_of_pod, verify_transport
    from tasks.evidence import iter_lines

    missing = [p for p in args.logs if not Path(p).is_file()]
    if missing:
        raise CliError(f"verify-transport: no such log file: {missing[0]}")
    pods = {Path(p).name: transport_of_pod(iter_lines(Path(p))) for p in args.logs}
    result = verify_transport(args.expect, pods)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(f"{result['verdict']}: " + "; ".join(result["reasons"]))
        for name, pod in pods.items():
            devices = ", ".join(f"{d['name']} (LID {d['lid']})" for d in pod["rdma_devices"]) or "none"
            print(f"  {name}: installed {pod['observed'] or '?'}, HCAs {pod['hcas']}, RDMA devices {devices}, "
                  f"{len(pod['throughput_mb_s'])} throughput windows, ready ACKs {pod['ready_acks_received']}")
    return EXIT_OK if result["verdict"] == "verified" else EXIT_FAILURES


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:
        from sim.server import main as sim_main
        return sim_main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "verify-transport":
            return cmd_verify_transport(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: every started process was stopped", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001
        from specs.models import SpecError
        if isinstance(e, SpecError):
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
