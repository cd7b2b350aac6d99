"""The layer contract in pyproject.toml ([tool.importlinter]) holds, and breaks when an import climbs back up.

import-linter reads the package from disk; an editable install maps the top-level folders into
`epdbench` through an import hook that it cannot walk, so each check runs on the layout a wheel
installs: the folders copied under `epdbench/` as pyproject's [tool.setuptools.package-dir] says.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def installed_layout(dest: Path) -> Path:
    """Copy every package of pyproject's package-dir map to where a wheel installs it; return `dest`."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for package, folder in pyproject["tool"]["setuptools"]["package-dir"].items():
        shutil.copytree(ROOT / folder, dest.joinpath(*package.split(".")), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "lint-imports"
    cmd = [str(exe)] if exe.exists() else [shutil.which("lint-imports") or "lint-imports"]
    return subprocess.run([*cmd, "--no-cache", "pyproject.toml"], cwd=tree, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(tree)})


@pytest.fixture
def tree(tmp_path) -> Path:
    return installed_layout(tmp_path / "site")


def test_every_package_of_the_source_tree_is_in_the_package_map():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = set(pyproject["package-dir"].values())
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert on_disk == mapped
    nested = [f"{package}.{'.'.join(init.parent.relative_to(ROOT / folder).parts)}"
              for package, folder in pyproject["package-dir"].items()
              for init in (ROOT / folder).glob("*/**/__init__.py")]
    assert sorted(pyproject["packages"]) == sorted([*pyproject["package-dir"], *nested])


def test_the_layer_contract_holds(tree):
    out = lint_imports(tree)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 3 kept, 0 broken." in out.stdout


def lint_with(tree: Path, module: str, line: str) -> str:
    """import-linter's output on `tree` with `line` appended to `module` (a path under epdbench/); it must fail."""
    path = tree / "epdbench" / module
    path.write_text(path.read_text() + f"\n{line}\n")
    out = lint_imports(tree)
    assert out.returncode != 0
    return out.stdout


def test_an_upward_import_breaks_the_contract(tree):
    out = lint_with(tree, "analysis/metrics.py", "from epdbench.flows import compare  # climbs four layers")
    assert "One way down through the layers BROKEN" in out
    assert "epdbench.analysis.metrics -> epdbench.flows" in out


def test_a_calibrate_mode_calling_back_into_planning_breaks_the_contract(tree):
    """The circle planning → ops → planning (each mode once took its helpers from planning) does not come back."""
    out = lint_with(tree, "cli/ops.py", "from epdbench.cli.planning import cmd_calibrate  # back up")
    assert "The calibrate modes import their shared helpers, never planning or each other BROKEN" in out
    assert "epdbench.cli.ops -> epdbench.cli.planning" in out


def test_one_calibrate_mode_importing_another_breaks_the_contract(tree):
    out = lint_with(tree, "cli/transport_fit.py", "from epdbench.cli.engine_steps import cmd_calibrate_engine_steps")
    assert "epdbench.cli.transport_fit -> epdbench.cli.engine_steps" in out


def test_a_side_effect_library_in_a_pure_module_breaks_the_contract(tree):
    out = lint_with(tree, "reports/fmt.py", "import mlflow  # tracking belongs in tasks/")
    assert "Pure modules import no orchestration, cluster, HTTP-client or tracking library BROKEN" in out
    assert "epdbench.reports.fmt -> mlflow" in out
