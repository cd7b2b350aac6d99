"""What `pip install epdbench` puts in an environment: one importable name, `epdbench`, with its
sub-packages, presets and templates, working from any directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERIC = ["tasks", "flows", "analysis", "reports", "specs", "sim", "manifests", "physics"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                    "-w", str(out)], check=True, capture_output=True, timeout=300, cwd=out)
    return next(out.glob("epdbench-*.whl"))


def test_the_wheel_holds_one_top_level_name_with_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"epdbench", "epdbench-0.1.0.dist-info"}
    for must in ("epdbench/flows/compare.py", "epdbench/tasks/load/loadgen.py", "epdbench/physics/costmodel.py",
                 "epdbench/specs/smoke.yaml", "epdbench/specs/pd-text.yaml", "epdbench/reports/templates/report.md.j2",
                 "epdbench/manifests/templates/engine.yaml.j2", "epdbench/cli/__main__.py",
                 "epdbench/physics/data/gpu_ops_h200.csv", "epdbench/tasks/local/install.sh"):
        assert must in names, must


def test_installed_wheel_imports_from_elsewhere_and_shadows_nothing(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import importlib.util, json, epdbench.flows, epdbench.tasks, epdbench.analysis\n"
        "from epdbench.specs.models import load_spec\n"
        "from epdbench.manifests.render import render_manifests\n"
        "from epdbench.reports.render import report_env\n"
        "spec = load_spec('pd-text')\n"
        "objs = render_manifests(spec, spec.configuration('pd-tcp'), 'r1')\n"
        "report_env().get_template('report.md.j2')\n"
        f"print(json.dumps({{'file': epdbench.__file__, 'objects': len(objs), "
        f"'generic': [m for m in {GENERIC!r} if importlib.util.find_spec(m)]}}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(site)
    assert got["objects"] > 0 and got["generic"] == []


def test_console_script_and_module_entry_points_run_outside_the_checkout(tmp_path):
    for cmd in ([sys.executable, "-m", "epdbench.cli", "plan", "--spec", "smoke", "--json"],
                [str(Path(sys.executable).parent / "epdbench"), "plan", "--spec", "smoke", "--json"]):
        out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert len(json.loads(out.stdout)) > 0
