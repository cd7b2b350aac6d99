"""The report and regression modules added for comparative reports stay pure: no orchestration,
cluster, HTTP-client or tracking library is imported (MLflow access lives in tasks/)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PURE = ["analysis.regression", "analysis.headline", "analysis.samples", "reports.render", "reports.findings",
        "reports.plots", "reports.environment", "reports.trend", "reports.fmt"]
FORBIDDEN = ["prefect", "kubernetes", "aiohttp", "httpx", "mlflow", "requests"]


def test_report_modules_import_no_side_effect_libraries():
    code = (f"import importlib, json, sys\n"
            f"for m in {PURE!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
