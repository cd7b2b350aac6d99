"""The lines compare prints as it goes say what the target has: CPU engines on a CPU host, no emulation lag."""
from __future__ import annotations

from epdbench.reports.progress import host_load_note, starting_line
from epdbench.specs.models import load_spec
from epdbench.tasks.publishing.publish import roles_text


def lines_of(preset: str) -> dict[str, str]:
    spec = load_spec(preset)
    return {c.name: starting_line(spec, c, roles_text(c)) for c in spec.configurations}


def test_cpu_engines_are_counted_as_engines_on_this_host_never_as_gpus():
    lines = lines_of("cpu-tiny")
    assert lines["aggregated"] == "[aggregated] starting 1×server TP1 (1 CPU engine on this host, no KV transfer)"
    assert lines["pd-nixl-tcp"] == ("[pd-nixl-tcp] starting 1×prefill TP1 + 1×decode TP1 (2 CPU engines on this "
                                    "host, KV over TCP by NIXL)")


def test_the_simulator_says_its_gpus_are_simulated_and_a_gpu_host_names_its_gpus():
    sim = lines_of("smoke")
    assert sim["pd-rdma"].endswith("(2 simulated GPUs, KV over RDMA)")
    assert sim["aggregated"].endswith("(2 simulated GPUs, no KV transfer)")
    gpu = lines_of("gpu-qwen25vl")          # every engine shares GPU 0
    assert all("(1 GPU, " in line for line in gpu.values()), gpu
    assert any(line.endswith("KV over TCP by Mooncake)") for line in gpu.values()), gpu


def test_a_contaminated_cell_names_only_the_lags_it_has():
    assert host_load_note({"contaminated": False, "loop_lag_p99_ms": 40.0}) == ""
    assert host_load_note({"contaminated": True, "emulation_lag_p99_ms": 3.04, "loop_lag_p99_ms": 12.0}) == (
        " — contaminated by host load (lag p99: emulation 3.0 ms, client 12.0 ms)")
    assert host_load_note({"contaminated": True, "emulation_lag_p99_ms": None, "loop_lag_p99_ms": 12.0}) == (
        " — contaminated by host load (lag p99: client 12.0 ms)")       # real engines: no emulation to lag
