"""benchmarks/README.md indexes every script of benchmarks/'s group folders once, under its own folder's heading, and
names no script that is not there."""
from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def indexed() -> list[str]:
    """group/script for each table row of the index, its group the `## \\`group/\\`` heading above it."""
    found: list[str] = []
    group = None
    for line in (BENCHMARKS / "README.md").read_text().splitlines():
        if heading := re.match(r"## `(\w+)/`", line):
            group = heading.group(1)
        elif group and (row := re.match(r"\| `([\w.]+\.(?:py|sh))` \|", line)):
            found.append(f"{group}/{row.group(1)}")
    return found


def on_disk() -> set[str]:
    return {p.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.glob("*/*") if p.suffix in (".py", ".sh")
            and p.parent.name != "data"}


def test_every_grouped_script_is_indexed_and_every_indexed_one_exists():
    assert on_disk(), "no scripts found under benchmarks/<group>/"
    assert sorted(indexed()) == sorted(on_disk())        # each script once


def test_each_row_runs_the_script_from_its_own_folder():
    text = (BENCHMARKS / "README.md").read_text()
    for path in on_disk():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{Path(path).name}` |"))
        assert f"benchmarks/{path}" in row, row
