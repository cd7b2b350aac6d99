"""One suite of one configuration, measured: every cell and trial on one HTTP session, records appended
as cells end, each cell attempt's end in the ledger (ok, degraded or failed)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from epdbench.analysis.labels import cell_label
from epdbench.analysis.metrics import summarize
from epdbench.analysis.noise import EMIT_LAG, emulation_lag_p99_ms, samples_p99_ms
from epdbench.reports.live import LiveCell
from epdbench.reports.progress import host_load_note
from epdbench.specs.models import ExperimentSpec
from epdbench.specs.workload import Calibration, Cell, build_requests, plan_cells
from epdbench.tasks.load.loadgen import LoadGenerator, records_as_dicts, unfinished_record
from epdbench.tasks.load.looplag import LoopLag
from epdbench.tasks.rundir.results import append_records
from epdbench.tasks.proc import stoppable
from epdbench.tasks.rundir.resume import record_attempt


HEALTH_POLL_S = 0.5     # how often a running cell looks for a dead process of its deployment
NO_NOISE = {"loop_lag_p99_ms": None, "emulation_lag_p99_ms": None, "emit_lag_p99_ms": None}   # a cell cut short


def say(msg: str) -> None:
    print(msg, flush=True)


class CellTimeout(RuntimeError):
    pass


class DeploymentDied(RuntimeError):
    """A replica or the router of the configuration exited while it was being measured."""


def cell_status(rows: list[dict], max_failed_fraction: float, dead: list[str]) -> tuple[str, str]:
    """ok, degraded (measured requests failed above the spec's threshold) or failed (a process died)."""
    if dead:
        return "failed", "; ".join(dead)
    measured = [r for r in rows if r["phase"] == "measured"]
    failed = [r for r in measured if not r["ok"]]
    if measured and len(failed) / len(measured) > max_failed_fraction:
        first = next((r["error"] for r in failed if r.get("error")), "")
        return "degraded", (f"{len(failed)} of {len(measured)} measured requests failed "
                            f"(threshold {max_failed_fraction:.0%}): {str(first)[:120]}")
    return "ok", ""


def cell_line(config: str, cell: Cell, trial: int, s: dict) -> str:
    def f(v, unit=" ms"):
        return "—" if v is None else f"{v:.1f}{unit}"
    line = (f"  [{config}] {cell.suite} {cell_label(cell.workload, cell.concurrency, cell.stream, short=True)} "
            f"trial {trial}: "
            f"{s['requests_ok']}/{s['requests_total']} ok, TTFT p50 {f(s['ttft_p50_ms'])}, "
            f"ITL p99 {f(s['itl_p99_ms'])}, {f(s['output_tok_s'], ' tok/s')}")
    return line + host_load_note(s)


def announce_cell(config: str, cell: Cell, trial: int, summary: dict, status: str, reason: str) -> None:
    """The cell's one line, and a second with the reason when it is not ok."""
    say(cell_line(config, cell, trial, summary))
    if status != "ok":
        say(f"  [{config}] {cell.suite} {cell_label(cell.workload, cell.concurrency, cell.stream, short=True)} "
            f"trial {trial}: {status}: {reason}")


@task(name="run-suite", cache_policy=NO_CACHE, retries=0)
def run_suite(endpoint: str, spec: ExperimentSpec, suite: str, config: str, run: str, records_path: str,
              calibration: dict, skip: frozenset = frozenset(), progress=None,
              deadline: float | None = None, health: "Callable[[], list[str]] | None" = None,
              lag_probe: "Callable[[], dict[str, str]] | None" = None, traces=None, telemetry=None) -> list[dict]:
    """Every cell of one suite, every trial, on one shared HTTP session; records appended after each
    cell (after each mixed window), and each cell attempt's end written to the ledger (ok, degraded or
    failed). Never retried: a measured cell is not repeated behind the user's back. A cell past
    spec.cell_timeout_s (or the configuration's deadline, monotonic) keeps the requests that finished and
    raises CellTimeout; a process of the deployment found dead (`health`, looked at every HEALTH_POLL_S while a
    cell runs, and after it) raises DeploymentDied, the cell stopped at once: what finished is kept, every other
    request of it recorded failed naming the process, and the attempt is failed in the ledger.
    Each cell's noise goes to its ledger entry: the load generator's event-loop lag and, with `lag_probe`
    (every simulator process's /metrics), the emulation lag over the cell (analysis.noise). With `traces` (a
    tasks.load.otlp_receiver.TraceCollector), the traced requests' spans are appended after their records. With
    `telemetry` (a target's GPU sampler: .cell(records) → analysis.gpu_telemetry.COLUMNS), each cell's GPU figures
    over its measured window join its noise figures in the ledger (a mixed window's streams share them)."""
    import pandas as pd

    cal = Calibration({k: tuple(v) for k, v in calibration.items()})
    cells = [c for c in plan_cells(spec) if c.suite == suite]
    done: list[dict] = []
    rdir = Path(records_path).parent

    def rows_of(cell: Cell, trial: int, recs) -> list[dict]:
        return [{**r, "run": run, "trial": trial, "config": config, "suite": cell.suite, "cell": cell.cell_id,
                 "workload": cell.workload, "stream": cell.stream, "concurrency": cell.concurrency}
                for r in records_as_dicts(recs)]

    def finish(batch: list[tuple[Cell, list[dict]]], trial: int, noise: dict) -> None:
        rows = [r for _, rs in batch for r in rs]
        append_records(Path(records_path), rows)
        keep_spans(rows)
        if telemetry is not None:
            noise = {**noise, **telemetry.cell(rows)}
        by_cell = {(config, c.cell_id, trial): noise for c, _ in batch}
        summaries = summarize(pd.DataFrame(rows), noise=by_cell).set_index("stream", drop=False)
        dead = health() if health else []
        for cell, cell_rows in batch:   # on disk first (records, then the ledger), then announced
            status, reason = cell_status(cell_rows, spec.max_failed_fraction, dead)
            record_attempt(rdir, config, cell.cell_id, trial, status, reason, noise)
            announce_cell(config, cell, trial, summaries.loc[cell.stream].to_dict(), status, reason)
            if progress:
                progress.cell_done()
            done.append({"cell": cell, "trial": trial, "rows": cell_rows, "status": status, "reason": reason})
        if dead:
            raise DeploymentDied("; ".join(dead))

    def keep_spans(rows: list[dict]) -> None:
        if traces is not None and traces.add_records(rows):
            traces.flush()

    live = LiveCell()
    scale = spec.time_scale

    client: dict = {}

    async def measured(work):
        """Run one cell's (or mixed window's) work; returns (its result, its noise figures). The client's
        loop lag is this loop's and, with worker processes, theirs."""
        before = await asyncio.to_thread(lag_probe) if lag_probe else None
        async with LoopLag(scale) as loop_lag:
            result = await work
        after = await asyncio.to_thread(lag_probe) if lag_probe else None
        samples = [*loop_lag.samples_s, *client["lg"].take_worker_lag()]
        return result, {"loop_lag_p99_ms": samples_p99_ms(samples),
                        "emulation_lag_p99_ms": emulation_lag_p99_ms(before, after) if lag_probe else None,
                        "emit_lag_p99_ms": (emulation_lag_p99_ms(before, after, EMIT_LAG) if lag_probe else None)}

    async def first_death() -> list[str]:
        """What of the deployment died, once something has (cancelled with its cell: bounded by the cell's end)."""
        while not (dead := await asyncio.to_thread(health)):
            await asyncio.sleep(HEALTH_POLL_S)
        return dead

    async def bounded(label: str, requests: list, work, finished: list, on_timeout, on_death):
        """Run `work` (of `requests`); past the limit, the requests that finished (collected in `finished`) are
        kept. A process of the deployment found dead meanwhile stops the work at once (every request after it would
        fail too, each still costing the live engines its legs): `on_death` keeps what finished and records the rest
        failed, naming the process."""
        cell_limit = spec.cell_timeout_s and spec.cell_timeout_s * scale
        limits = [x for x in (cell_limit, deadline and deadline - time.monotonic()) if x]
        warmup = sum(1 for r in requests if r.phase == "warmup")
        live.reset(f"[{config}] {label}", len(requests) - warmup, warmup)
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(first_death()) if health else None
        try:
            done, _ = await asyncio.wait([t for t in (task, watch) if t is not None],
                                         timeout=min(limits) if limits else None,
                                         return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if watch in done:
                on_death(list(finished), watch.result())      # raises DeploymentDied
            on_timeout(list(finished))
            raise CellTimeout(f"{label} did not finish within {min(limits):.0f} s "
                              "(cell_timeout_s / configuration_timeout_s)") from None
        finally:
            for t in (task, watch):
                if t is not None and not t.done():
                    t.cancel()
                    await asyncio.gather(t, return_exceptions=True)
            live.stop()

    def collector():
        finished: list = []

        def on_record(rec) -> None:
            finished.append(rec)
            live.on_record(rec)
        return finished, on_record

    def keep_partial(batch: list[tuple[Cell, list]], trial: int):
        """What a timed-out cell (or mixed window) keeps: every request that finished, each under its
        stream (told apart by prompt hash); the attempt is failed in the ledger, so resume re-runs it."""
        def keep(recs) -> None:
            stream_of = {r.prompt_hash: c.stream for c, requests in batch for r in requests}
            rows = [row for c, _ in batch
                    for row in rows_of(c, trial, [r for r in recs if stream_of.get(r.prompt_hash) == c.stream])]
            if rows:
                append_records(Path(records_path), rows)
                keep_spans(rows)
            for c, _ in batch:
                n = sum(1 for row in rows if row["stream"] == c.stream)
                record_attempt(rdir, config, c.cell_id, trial, "failed", f"timed out; {n} finished requests kept")
        return keep

    def fail_unfinished(batch: list[tuple[Cell, list]], trial: int):
        """What a cell (or mixed window) keeps when a process of its deployment died while it ran: every request
        that finished, and every other one (in flight, or not sent) recorded failed naming the dead process; the
        attempt then ends failed (finish raises DeploymentDied)."""
        def fail(recs, dead: list[str]) -> None:
            why = "not completed: " + "; ".join(dead)
            done_keys = {(r.phase, r.index, r.prompt_hash) for r in recs}
            rows = []
            for c, requests in batch:
                hashes = {r.prompt_hash for r in requests}
                mine = [r for r in recs if r.prompt_hash in hashes]     # told apart by prompt hash (keep_partial)
                mine += [unfinished_record(r, run[-8:], why) for r in requests
                         if (r.phase, r.index, r.prompt_hash) not in done_keys]
                rows.append((c, rows_of(c, trial, sorted(mine, key=lambda r: (r.phase != "warmup", r.index)))))
            finish(rows, trial, NO_NOISE)
        return fail

    async def go():
        async with LoadGenerator(endpoint, spec.model.name, spec.request_timeout_s, run_tag=run[-8:],
                                 time_scale=scale, processes=spec.client_processes) as lg:
            client["lg"] = lg
            for trial in range(spec.trials):
                if all((c.cell_id, trial) in skip for c in cells):
                    say(f"  [{config}] {suite} trial {trial}: already recorded, skipped (resume)")
                    if progress:
                        progress.cell_done(len(cells))
                    continue
                if cells[0].kind == "mixed":
                    requests = [build_requests(spec, c, trial, calibration=cal) for c in cells]
                    finished, on_record = collector()
                    recs, noise = await measured(bounded(
                        f"{suite} (mixed) trial {trial}", [r for rs in requests for r in rs],
                        lg.run_streams([(r, c.concurrency) for r, c in zip(requests, cells)], on_record), finished,
                        keep_partial(list(zip(cells, requests)), trial), fail_unfinished(list(zip(cells, requests)),
                                                                                         trial)))
                    finish([(c, rows_of(c, trial, rs)) for c, rs in zip(cells, recs)], trial, noise)
                    continue
                for cell in cells:
                    if (cell.cell_id, trial) in skip:
                        if progress:
                            progress.cell_done()
                        continue
                    requests = build_requests(spec, cell, trial, calibration=cal)
                    finished, on_record = collector()
                    recs, noise = await measured(bounded(
                        f"{suite} {cell_label(cell.workload, cell.concurrency, cell.stream, short=True)} "
                        f"trial {trial}", requests,
                        lg.run_cell(requests, cell.concurrency, on_record), finished,
                        keep_partial([(cell, requests)], trial), fail_unfinished([(cell, requests)], trial)))
                    finish([(cell, rows_of(cell, trial, recs))], trial, noise)

    stoppable.run(go())   # a SIGTERM meanwhile stops it at once (tasks.proc.stoppable)
    return done
