"""How much faster than real time the virtual-time core runs a preset: modelled seconds over host seconds.

Per preset: prompt calibration and every cell's requests are built first (one untimed round, as `calibrate` and
`whatif` re-run cells with their requests cached; its records give the digest printed with the figures), then
each round runs every configuration in virtual time (`tasks.sim.vrun.simulate_configuration`, warm-ups included)
and prints the host time, the modelled time (the virtual clock when each configuration's last cell ends,
summed) and their ratio, then the best, median and worst round.

One process's speed is steady within a few % from round to round, but fresh processes of the same code differ by
up to ~10 % (memory layout), and the host drifts by up to 1.5× over hours on the development VM. So a figure
is the best of several processes (`--processes`), and code is compared by alternating processes of both
versions (`--against REV`: REV checked out in a temporary git worktree, each version's processes run in turn
on the working tree's spec files). A difference counts only when every process of one version was faster than
every process of the other (else: within noise; equally fast code splits so by chance 2.9 % of the time with 4
processes each, 0.8 % with 5); the record digests say whether the records are the same.
`--profile` adds, for the last round of an in-process run, the host time per source file (cProfile inflates
code that makes many small calls).

    python benchmarks/simulator/vtime_speed.py [smoke epd-multimodal pd-text ...] [--rounds 3] [--profile]
    python benchmarks/simulator/vtime_speed.py epd-reuse smoke --processes 5 --against HEAD
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import hashlib
import json
import math
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one_round(spec, calibration, rows: list | None = None) -> tuple[float, float]:
    """(host seconds, modelled seconds) of every configuration of the spec, one after the other; the records
    go to `rows` if given."""
    from epdbench.tasks.sim.vrun import simulate_configuration
    modelled = 0.0
    host = 0.0
    for config in spec.configurations:
        ends: list[float] = []
        t0 = time.perf_counter()
        got = simulate_configuration(spec, config, calibration,
                                     on_cell=lambda *_: ends.append(asyncio.get_running_loop().time()))
        host += time.perf_counter() - t0
        modelled += ends[-1] if ends else 0.0
        if rows is not None:
            rows.extend(got)
    return host, modelled


def digest(rows: list[dict]) -> str:
    """Of the records, whatever order they came in."""
    lines = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def by_file(profile: cProfile.Profile, top: int = 12) -> list[tuple[float, str]]:
    spent: collections.Counter = collections.Counter()
    for (path, _, _), (_, _, own, _, _) in pstats.Stats(profile).stats.items():
        path = "(built-in functions)" if path == "~" else re.sub(r".*/lib/python3\.\d+/(site-packages/)?", "", path)
        spent[path.removeprefix(str(ROOT) + "/")] += own
    total = sum(spent.values()) or 1.0
    return [(own / total, path) for path, own in spent.most_common(top)]


def measure(name: str, rounds: int, profile: bool = False, quiet: bool = False) -> dict:
    """One process's figures for a preset or spec path: modelled seconds, host seconds per round, digest."""
    from epdbench.specs.models import load_spec
    from epdbench.tasks.sim.vrun import prompt_calibration
    spec = load_spec(name)
    calibration = prompt_calibration(spec)
    rows: list[dict] = []
    one_round(spec, calibration, rows)                 # builds and caches every cell's requests
    hosts: list[float] = []
    modelled = 0.0
    for k in range(max(1, rounds)):
        prof = cProfile.Profile() if profile and k == rounds - 1 else None
        if prof:
            prof.enable()
        host, modelled = one_round(spec, calibration)
        if prof:
            prof.disable()
        hosts.append(host)
        if not quiet:
            note = " (profiled)" if prof else ""
            print(f"{spec.name}: {host:.3f} s host for {modelled:.1f} s modelled: ×{modelled / host:.0f}{note}",
                  flush=True)
        if prof:
            for share, path in by_file(prof):
                print(f"    {share:6.1%}  {path}")
    timed = hosts[:-1] if profile and len(hosts) > 1 else hosts     # a profiled round is no speed figure
    return {"preset": spec.name, "modelled_s": modelled, "host_s": timed, "records": digest(rows)}


def spread(hosts: list[float], modelled: float) -> str:
    best, median, worst = min(hosts), statistics.median(hosts), max(hosts)
    return f"{best:.3f}–{worst:.3f} s, median {median:.3f} s (×{modelled / best:.0f} at best)"


def chance(n: int, m: int) -> float:
    """How likely n and m processes of equally fast code split with every one of either faster than every one of
    the other, by chance alone (exact Mann-Whitney test at U = 0, both sides)."""
    return 2 / math.comb(n + m, n)


def verdict(base: list[float], new: list[float]) -> str:
    """Whether `new` (each process's best host time) is faster than `base` beyond the noise between processes:
    only when every process of one was faster than every process of the other."""
    ratio = f"×{min(base) / min(new):.2f} on the best process"
    p = chance(len(base), len(new))
    if max(new) < min(base):
        return f"faster beyond noise: {ratio} (every process faster; by chance: {p:.1%})"
    if max(base) < min(new):
        return f"slower beyond noise: {ratio} (every process slower; by chance: {p:.1%})"
    return f"within noise: {ratio}, the processes' ranges overlap"


def spec_path(name: str) -> str:
    """The working tree's file for a preset (so both versions of an A/B read the same spec), else `name`."""
    candidate = ROOT / "specs" / f"{name}.yaml"
    return str(candidate) if "/" not in name and candidate.exists() else name


def child(name: str, rounds: int, pythonpath: str | None, label: str) -> dict:
    """`measure` in a fresh process, importing epdbench from `pythonpath` if given (else as installed); prints
    its best round under `label`."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with tempfile.TemporaryDirectory() as cwd:            # nothing imported from the caller's directory
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--rounds", str(rounds),
                               name], env=env, cwd=cwd, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"vtime_speed: a measuring process failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {got['preset']} {label}: best of {rounds} {min(got['host_s']):.3f} s", flush=True)
    return got


def checkout(rev: str, into: Path) -> tuple[str, str]:
    """REV in a git worktree under `into`, and a directory to put on PYTHONPATH that imports it as epdbench;
    returns (that directory, REV's short commit)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"vtime_speed: no such revision {rev!r}: {commit.stderr.strip()}")
    tree = into / "tree"
    added = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), rev],
                           capture_output=True, text=True)
    if added.returncode != 0:
        raise SystemExit(f"vtime_speed: cannot check out {rev!r}: {added.stderr.strip()}")
    # its package's directories, as its pyproject.toml maps them under `epdbench`, ahead of the installed package
    dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    pkg = into / "path" / "epdbench"
    shutil.copytree(tree / dirs["epdbench"], pkg)
    for name, sub in dirs.items():
        if name != "epdbench":
            (pkg / name.removeprefix("epdbench.")).symlink_to(tree / sub, target_is_directory=True)
    return str(into / "path"), commit.stdout.strip()


def against(rev: str, names: list[str], rounds: int, processes: int) -> None:
    into = Path(tempfile.mkdtemp(prefix="vtime-speed-"))
    try:
        path, commit = checkout(rev, into)
        for name in names:
            runs: dict[str, list[dict]] = {commit: [], "working tree": []}
            for p in range(processes):
                for label, pythonpath in ((commit, path), ("working tree", None)):
                    runs[label].append(child(spec_path(name), rounds, pythonpath,
                                             f"{label} process {p + 1}/{processes}"))
            report(runs, rounds)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(into / "tree")],
                       capture_output=True)
        shutil.rmtree(into, ignore_errors=True)


def report(runs: dict[str, list[dict]], rounds: int) -> None:
    """Per version: the spread of its processes' best rounds and the records' digest; then the verdict."""
    first = next(iter(runs.values()))
    modelled = first[0]["modelled_s"]
    print(f"{first[0]['preset']} ({modelled:.1f} s modelled; {len(first)} processes × {rounds} rounds"
          f"{' per version' if len(runs) > 1 else ''}):")
    bests = {}
    for label, got in runs.items():
        bests[label] = [min(g["host_s"]) for g in got]
        digests = sorted({g["records"] for g in got})
        print(f"  {label}: best rounds of its processes {spread(bests[label], modelled)}; records "
              f"{', '.join(digests)}{' (differ between processes!)' if len(digests) > 1 else ''}")
    if len(runs) == 2:
        (base_label, base), (_, new) = runs.items()
        same = {g["records"] for g in base} == {g["records"] for g in new}
        print(f"  → against {base_label}: {verdict(bests[base_label], [min(g['host_s']) for g in new])}; records "
              f"{'identical' if same else 'DIFFER'}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="*", default=["smoke", "epd-multimodal", "epd-reuse", "pd-text"],
                    help="presets or spec paths (default: smoke epd-multimodal epd-reuse pd-text)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per process (default: 3)")
    ap.add_argument("--processes", type=int, default=1,
                    help="fresh processes per preset (default 1: this one), per version with --against (default 5)")
    ap.add_argument("--against", metavar="REV", help="compare with git revision REV, processes alternating")
    ap.add_argument("--profile", action="store_true", help="host time per source file in the last round")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 1 or args.processes < 1:
        ap.error("--rounds and --processes must be at least 1")
    if args.profile and (args.against or args.processes > 1):
        ap.error("--profile profiles this process: not with --against or --processes")
    if args.child:
        for name in args.presets:
            print(json.dumps(measure(name, args.rounds, quiet=True)), flush=True)
        return 0
    if args.against:
        processes = args.processes if args.processes > 1 else 5
        if chance(processes, processes) > 0.05:
            ap.error(f"--against needs at least 4 processes per version: with {processes}, equally fast code "
                     f"would split into a faster and a slower version {chance(processes, processes):.0%} of the time")
        against(args.against, args.presets, args.rounds, processes)
        return 0
    for name in args.presets:
        if args.processes == 1:
            got = measure(name, args.rounds, args.profile)
            print(f"{got['preset']}: {len(got['host_s'])} rounds {spread(got['host_s'], got['modelled_s'])}; "
                  f"records {got['records']}", flush=True)
            continue
        runs = []
        for p in range(args.processes):
            runs.append(child(name, args.rounds, None, f"process {p + 1}/{args.processes}"))
        report({"working tree": runs}, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
