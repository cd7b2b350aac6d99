"""The report files of a results directory — report.md, report.html, plots/*.png — written from the
directory's own data (spec.yaml, records.parquet, outcome.json); and a comparison's stored results
fetched back from MLflow to re-render them."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd

from epdbench.analysis.goodput import GOODPUT_COLUMNS, attainment, goodput, rate_cells
from epdbench.analysis.metrics import summarize
from epdbench.analysis.breakdown import cell_breakdown
from epdbench.analysis.pareto import pareto_points
from epdbench.reports.breakdown import breakdown_plots, breakdown_view
from epdbench.reports.environment import environment
from epdbench.reports.goodput import goodput_view
from epdbench.reports.pareto import pareto_view
from epdbench.reports.plots import pareto_plots, plot_note, suite_plots
from epdbench.reports.render import render_html, render_markdown, report_context
from epdbench.specs.models import RateSuite, SpecError, load_spec
from epdbench.specs.profile import load_profile
from epdbench.tasks.publishing.publish_state import OPTIONAL_ARTIFACTS, PROFILE_FILE
from epdbench.tasks.rundir.results import read_records, write_text_atomic
from epdbench.tasks.rundir.resume import LEDGER, ledger_path, noise_of
from epdbench.tasks.rundir.traces import TRACES_DIR, read_spans, traces_path

REPORT_FILES = ("report.md", "report.html")
NEEDED = ("outcome.json", "records.parquet", "spec.yaml")


class ResultsError(Exception):
    """A results directory (or MLflow run) the report cannot be rendered from; one line."""


def resolved_spec(rdir: Path):
    """The run's resolved spec.yaml; None when it no longer loads (the report then goes without it)."""
    try:
        return load_spec(str(rdir / "spec.yaml"))
    except (SpecError, OSError):
        return None


def applied_profile(rdir: Path) -> dict | str | None:
    """The calibration profile `compare --profile` copied into the run (profile.yaml): None without one, why
    not when it no longer reads."""
    if not (rdir / PROFILE_FILE).exists():
        return None
    try:
        return load_profile(rdir / PROFILE_FILE)
    except SpecError as e:
        return str(e)


def write_plots(rdir: Path, plots) -> None:
    """plots/ holds exactly this report's plots."""
    pdir = rdir / "plots"
    pdir.mkdir(exist_ok=True)
    for stale in set(pdir.glob("*.png")) - {pdir / p.name for p in plots}:
        stale.unlink()
    for p in plots:
        (pdir / p.name).write_bytes(p.png)


def write_goodput(rdir: Path, spec, records: pd.DataFrame, gpus: dict[str, int]) -> tuple[pd.DataFrame, dict | None]:
    """goodput.csv (header only without rate suites with an SLO) from the records and the resolved spec;
    returns the attainment rows (for the plot) and the report's Goodput view."""
    att = attainment(records, rate_cells(spec) if spec is not None else {})
    table = goodput(att, gpus)
    table.to_csv(rdir / "goodput.csv", index=False)
    slos = {s.name: s.slo for s in spec.suites if isinstance(s, RateSuite) and s.slo} if spec is not None else {}
    return att, goodput_view(table, slos)


def ttft_breakdown(rdir: Path, meta: dict, records: pd.DataFrame) -> pd.DataFrame:
    """Each configuration's TTFT breakdown per cell (analysis.breakdown) from its traces/<config>.parquet."""
    topology = {c["name"]: c.get("topology") for c in meta["configurations"] if c.get("topology")}
    tables = [cell_breakdown(read_spans(traces_path(rdir, c["name"])), records, topology)
              for c in meta["configurations"]]
    tables = [t for t in tables if not t.empty]
    return pd.concat(tables, ignore_index=True) if tables else None


def read_goodput(path: Path) -> pd.DataFrame:
    """goodput.csv as written by write_goodput (empty when absent or without rows)."""
    if not path.is_file():
        return pd.DataFrame(columns=GOODPUT_COLUMNS)
    table = pd.read_csv(path, keep_default_na=True)
    return table.astype(object).where(table.notna(), None)


def write_report(rdir: Path, meta: dict, verdicts: dict, regression: dict | None = None,
                 summary: pd.DataFrame | None = None, out: Path | None = None,
                 gpu_hour_usd: float | None = None) -> list[Path]:
    """report.md, report.html, plots/, goodput.csv and pareto.csv (analysis.pareto's points) from the directory's
    records, written there or into `out`, priced at `gpu_hour_usd` (default: the run's spec); returns the report
    paths."""
    out = out or rdir
    out.mkdir(parents=True, exist_ok=True)
    records = read_records(rdir / "records.parquet")
    gpus = {c["name"]: c["gpus"] for c in meta["configurations"]}
    if summary is None:
        summary = summarize(records, gpus, noise_of(rdir, [c["name"] for c in meta["configurations"]]))
    spec = resolved_spec(rdir)
    profile = applied_profile(rdir)
    att, goodput_table = write_goodput(out, spec, records, gpus)
    configs = [c["name"] for c in meta["configurations"]]
    plots = suite_plots(summary, records, configs, att, plot_note(meta))
    table = ttft_breakdown(rdir, meta, records)
    parts_plots = breakdown_plots(table, configs, plot_note(meta))
    price = gpu_hour_usd if gpu_hour_usd is not None else spec.cost.gpu_hour_usd if spec is not None else None
    points = pareto_points(summary, price)
    write_text_atomic(out / "pareto.csv", points.to_csv(index=False))
    frontier_plots = pareto_plots(points, configs, plot_note(meta))
    write_plots(out, plots + parts_plots + frontier_plots)
    context = report_context(meta, summary, verdicts, environment(spec, profile) if spec is not None else None,
                             records, regression, plots, goodput_table,
                             breakdown_view(table, configs, spec.tracing.enabled if spec is not None else None,
                                            parts_plots, meta.get("clock") == "virtual"),
                             pareto_view(points, meta, price, frontier_plots))
    (out / "report.md").write_text(render_markdown(context))
    (out / "report.html").write_text(render_html(context))
    return [out / name for name in REPORT_FILES]


def rerender(rdir: Path, out: Path | None = None, gpu_hour_usd: float | None = None) -> list[Path]:
    """Re-render a results directory written by `epdbench compare` (its stored regression check included),
    into the directory itself or into `out`, priced at `gpu_hour_usd` when given."""
    missing = [name for name in NEEDED if not (rdir / name).exists()]
    if missing:
        raise ResultsError(f"{rdir}: no {', '.join(missing)} here; give a results directory written by "
                           "'epdbench compare'")
    outcome = json.loads((rdir / "outcome.json").read_text())
    return write_report(rdir, outcome["meta"], outcome["verdicts"], outcome.get("regression"), out=out,
                        gpu_hour_usd=gpu_hour_usd)


def download_comparison(tracking_uri: str, run_id: str, dest: Path | None = None) -> Path:
    """The comparison run's stored results (outcome, records, spec; the calibration profile and traces/ if any)
    into `dest` (default results/<run name>), with each configuration run's cell ledger
    (evidence/<config>/cells.json): the host-load figures that mark cells contaminated, without which the report
    would name winners the run's own report withheld."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ResultsError(f"--run-id {run_id}: no such run in {tracking_uri}; give a comparison run id "
                           "(printed by compare, or in the MLflow UI)") from None
    if run.data.tags.get("epdbench.kind") != "comparison":
        raise ResultsError(f"--run-id {run_id}: a {run.data.tags.get('epdbench.kind', 'non-epdbench')} run; "
                           "give the comparison (parent) run")
    dest = dest or Path("results") / run.info.run_name
    dest.mkdir(parents=True, exist_ok=True)
    stored = {a.path for a in client.list_artifacts(run_id)}
    for name in NEEDED:
        if name not in stored:
            raise ResultsError(f"--run-id {run_id}: the run has no {name} artifact; it cannot be re-rendered")
        client.download_artifacts(run_id, name, str(dest))
    for name in (*OPTIONAL_ARTIFACTS, TRACES_DIR):
        if name in stored:
            client.download_artifacts(run_id, name, str(dest))
    children = client.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}' and "
                                  "tags.`epdbench.kind` = 'configuration'", max_results=1000)
    for child in children:
        config = child.data.tags.get("epdbench.config")
        wanted = f"evidence/{LEDGER}"
        if not config or wanted not in {a.path for a in client.list_artifacts(child.info.run_id, "evidence")}:
            continue
        with tempfile.TemporaryDirectory(dir=dest) as tmp:
            got = Path(client.download_artifacts(child.info.run_id, wanted, tmp))
            ledger = ledger_path(dest, config)
            ledger.parent.mkdir(parents=True, exist_ok=True)
            got.replace(ledger)
    return dest
