"""benchmarks/gpu/fault_gpu_memory.py without a GPU: every fault's spec is one compare accepts, with the
configurations the fault needs (the killed one first) and one small cell; bad input is one line and exit 2."""
from __future__ import annotations

import pytest
import yaml

from epdbench.specs.models import load_spec
from tests.benchmark_scripts import load_benchmark

bench = load_benchmark("gpu/fault_gpu_memory")


@pytest.mark.parametrize("fault", bench.FAULTS)
def test_each_faults_spec_loads_with_the_configurations_it_needs(tmp_path, fault):
    path = bench.fault_spec("gpu-qwen25vl", fault, tmp_path)
    spec = load_spec(str(path))
    names = [c.name for c in spec.configurations]
    assert names[0] == ("pd-nixl-tcp" if fault in ("prefill-killed", "decode-killed", "kv-unreachable",
                                                    "start-timeout") else "aggregated")
    assert [s.name for s in spec.suites] == ["fixed"] and spec.target.local.router == "builtin"
    assert spec.target.local.device == "cuda"
    raw = yaml.safe_load(path.read_text())["target"]["local"]
    assert ("--no-such-argument" in raw.get("extra_args", [])) == (fault == "bad-argument")
    assert (spec.target.local.startup_timeout_s == 30) == (fault == "start-timeout")


def test_an_unknown_fault_is_one_line_and_exit_2(tmp_path, capsys):
    assert bench.main(["--vllm-python", "python", "--out", str(tmp_path), "--faults", "prefill-killed,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("unknown fault(s): nope;")
