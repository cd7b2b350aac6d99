"""The pure packages (analysis, report rendering, specs, cost model) import no orchestration,
cluster, HTTP-client or tracking library."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every module of analysis/ and reports/, plus the pure modules elsewhere.
PURE = sorted(f"{pkg}.{p.stem}" for pkg in ("analysis", "reports") for p in (ROOT / pkg).glob("*.py")
              if p.stem != "__init__") + ["specs.models", "specs.workload", "specs.plan", "specs.request",
                                          "sim.costmodel", "sim.prefix_cache", "manifests.render",
                                          "tasks.k8s_status"]
FORBIDDEN = ["prefect", "kubernetes", "aiohttp", "httpx", "mlflow", "requests"]


def test_pure_modules_import_no_side_effect_libraries():
    code = (f"import importlib, json, sys\n"
            f"for m in {PURE!r}: importlib.import_module(m)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
