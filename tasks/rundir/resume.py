"""What a resumed run may keep: the ledger of cell attempts per configuration, and the check of every
finished cell against its records (counts of successful measured requests, and their prompt hashes
against the seeded plan). A cell is skipped only when both hold; anything else is run again, and its
earlier rows are dropped first, so every request is recorded exactly once.

Files a run cannot read give one line naming the file and the fix (StateError), never a traceback.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from epdbench.specs.models import ExperimentSpec, SpecError, load_spec, resume_changes
from epdbench.specs.workload import Calibration, build_requests, plan_cells
from epdbench.tasks.rundir.results import read_records, write_json

LEDGER = "cells.json"


class StateError(RuntimeError):
    """A results-folder file that cannot be read; the message names it and the fix."""


def read_json_file(path: Path, default):
    """A JSON file of the results folder, or `default` when absent; StateError when unreadable."""
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise StateError(f"{path} is unreadable ({type(e).__name__}: {str(e)[:80]}); delete it to start that "
                         "part again, or restore it") from None


def read_records_checked(path: Path):
    try:
        return read_records(path)
    except (pa.ArrowException, OSError) as e:
        raise StateError(f"{path} is unreadable ({type(e).__name__}: {str(e)[:80]}); move it away to measure "
                         "every cell again, or restore it") from None


def ledger_path(rdir: Path, config: str) -> Path:
    return rdir / "evidence" / config / LEDGER


def read_ledger(rdir: Path, config: str) -> dict[str, dict]:
    data = read_json_file(ledger_path(rdir, config), {})
    return data if isinstance(data, dict) else {}


def ledger_key(cell_id: str, trial: int) -> str:
    return f"{cell_id}#t{trial}"


def record_attempt(rdir: Path, config: str, cell_id: str, trial: int, status: str, reason: str = "",
                   noise: dict | None = None) -> None:
    """Remember how one cell attempt ended: ok, degraded (requests failed above the threshold) or failed,
    and the noise measured over it (lag p99s, analysis.noise)."""
    ledger = read_ledger(rdir, config)
    ledger[ledger_key(cell_id, trial)] = {"status": status, "reason": reason, **({"noise": noise} if noise else {})}
    write_json(ledger_path(rdir, config), ledger)


def noise_of(rdir: Path, configs) -> dict[tuple[str, str, int], dict]:
    """(config, cell id, trial) → the lag figures the ledger holds for that cell attempt."""
    out: dict[tuple[str, str, int], dict] = {}
    for config in configs:
        for key, entry in read_ledger(rdir, config).items():
            cell_id, _, trial = key.rpartition("#t")
            if isinstance(entry, dict) and isinstance(entry.get("noise"), dict) and trial.isdigit():
                out[(config, cell_id, int(trial))] = entry["noise"]
    return out


_PLANNED: dict[str, dict[tuple[str, int], list[str]]] = {}   # one plan per (spec, calibration) and process


def expected_hashes(spec: ExperimentSpec, calibration: dict | None) -> dict[tuple[str, int], list[str]]:
    """(cell id, trial) → prompt hashes of its measured requests, in index order, as the plan makes them
    (computed once per spec and calibration: multimodal plans encode their images, seconds of work); in virtual
    time with the stand-in images the virtual core serves (specs.workload.build_requests)."""
    key = spec.model_dump_json() + json.dumps(calibration, sort_keys=True)
    if key in _PLANNED:
        return _PLANNED[key]
    cal = Calibration({k: tuple(v) for k, v in (calibration or {}).items()})
    out = {}
    for cell in plan_cells(spec):
        for trial in range(spec.trials):
            out[(cell.cell_id, trial)] = [r.prompt_hash for r in build_requests(spec, cell, trial, calibration=cal,
                                                                         stand_in_images=spec.virtual)
                                          if r.phase == "measured"]
    _PLANNED[key] = out
    return out


def cells_done(rdir: Path, spec: ExperimentSpec, config: str, records=None) -> set[tuple[str, int]]:
    """(cell id, trial) whose last attempt ended ok (its failed requests within the spec's threshold) and
    whose measured records are exactly the planned requests, each once (same count, same prompt hashes)."""
    records = read_records_checked(rdir / "records.parquet") if records is None else records
    ledger = read_ledger(rdir, config)
    calibration = read_json_file(rdir / "calibration.json", None)
    if records.empty or calibration is None:
        return set()
    want = expected_hashes(spec, calibration)
    mine = records[(records["config"] == config) & (records["phase"] == "measured")]
    done = set()
    for (cell, trial), rows in mine.groupby(["cell", "trial"]):
        key = (cell, int(trial))
        if ledger.get(ledger_key(*key), {}).get("status") != "ok" or key not in want:
            continue
        if list(rows.sort_values("index")["prompt_hash"]) == want[key]:   # each planned request once
            done.add(key)
    return done


def missing_cells(spec: ExperimentSpec, done: set[tuple[str, int]]) -> list[tuple[str, int]]:
    """Planned (cell id, trial) not in `done` (cells_done); empty when all of a configuration's data is there."""
    return [(c.cell_id, t) for c in plan_cells(spec) for t in range(spec.trials) if (c.cell_id, t) not in done]


def validate_state_files(rdir: Path) -> None:
    """Read every state file a resume relies on; StateError naming the first one that cannot be read."""
    for path in [rdir / "state.json", rdir / "calibration.json", rdir / "outcome.json",
                 *sorted((rdir / "evidence").glob("*/*.json"))]:
        read_json_file(path, None)
    read_records_checked(rdir / "records.parquet")


def check_resumable(rdir: Path, spec: ExperimentSpec) -> None:
    """StateError when resuming the run in `rdir` with `spec` would measure its remaining cells otherwise than
    its first attempt did (specs.models.resume_changes against the folder's spec.yaml) — as `compare --resume`
    with another --seed, --configs, --target or --profile, or a UI run given an existing run key with another
    preset, would; the message names each change. How the cluster is reached and where results are logged may
    change."""
    path = rdir / "spec.yaml"
    if not path.exists():
        return
    try:
        stored = load_spec(str(path))
    except SpecError as e:
        raise StateError(f"{path}: cannot be read, so the run cannot be resumed ({e}); start a new run") from None
    changed = resume_changes(stored, spec)
    if changed:
        raise StateError(f"--resume {rdir}: the options given change the run's spec ({'; '.join(changed)}); a "
                         "resumed run measures its remaining cells as its first attempt did: resume without them, "
                         "or start a new run")
