"""The benchmark scripts (benchmarks/<group>/<name>.py) as modules, for the tests that call their functions."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def load_benchmark(path: str) -> ModuleType:
    """benchmarks/<path>.py (`path` as "<group>/<name>") imported afresh under its name (not registered in
    sys.modules)."""
    spec = importlib.util.spec_from_file_location(Path(path).name, BENCHMARKS / f"{path}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
