"""The local target's part of the spec: what real engines on one host can run is checked before anything starts,
one line naming the field and the fix."""
import pytest

from epdbench.specs.models import SpecError, load_spec, parse_spec, spec_fingerprint


def cpu_tiny(mutate=None) -> dict:
    data = load_spec("cpu-tiny").model_dump(mode="json")
    if mutate:
        mutate(data)
    return data


def test_the_cpu_tiny_preset_runs_real_engines_on_this_host():
    spec = load_spec("cpu-tiny")
    assert spec.target.kind == "local" and spec.target.local.tiny_model and spec.target.local.device == "cpu"
    assert [c.name for c in spec.configurations] == ["aggregated", "pd-nixl-tcp"]
    assert spec.configuration("pd-nixl-tcp").kv_connector == "nixl"
    assert spec.kv_block_tokens == 128       # vLLM's CPU build's block when the spec names none


def pd_with(**fields):
    def mutate(data):
        data["configurations"][1].update(fields)
    return mutate


@pytest.mark.parametrize("mutate, problem", [
    (pd_with(kv_connector="mooncake"), "field 'configurations.1' (pd-nixl-tcp): MooncakeConnector does not start "
                                       "without an accelerator (target.local.device cpu): use kv_connector nixl"),
    (pd_with(kv_transport="rdma", roles=[{"role": "prefill", "rdma_interfaces": 1},
                                         {"role": "decode", "rdma_interfaces": 1}]),
     "field 'configurations.1' (pd-nixl-tcp): KV over RDMA needs NICs the CPU build does not drive"),
    (lambda d: d["hardware"].update(gpus_per_node=3) or d["configurations"].append(
        {"name": "epd", "topology": "epd", "kv_transport": "tcp",
         "roles": [{"role": "encode"}, {"role": "prefill"}, {"role": "decode"}]}),
     "field 'configurations.2' (epd): EPD on the local target needs device cuda"),
    (lambda d: d["target"]["local"].update(model_path="/models/x"),
     "field 'target.local': tiny_model makes the model the engines load: leave model_path unset"),
    (lambda d: d["target"]["local"].update(env={"UCX_TLS": "all"}),
     "field 'target.local': env: UCX_TLS is set by epdbench and cannot be overridden"),
    (lambda d: d["target"]["local"].update(device="tpu"),
     "field 'target.local.device': Input should be 'cpu' or 'cuda'"),
])
def test_what_one_host_cannot_run_is_refused_naming_the_field(mutate, problem):
    with pytest.raises(SpecError) as e:
        parse_spec(cpu_tiny(mutate), "cpu-tiny")
    assert problem in str(e.value) and "\n" not in str(e.value)


def test_the_same_configurations_on_a_gpu_host_may_use_mooncake():
    def on_cuda(data):
        data["target"]["local"].update(device="cuda", tiny_model=False)
        data["configurations"][1]["kv_connector"] = "mooncake"
    spec = parse_spec(cpu_tiny(on_cuda))
    assert spec.kv_block_tokens == 16


def test_the_local_section_leaves_other_targets_fingerprints_alone():
    smoke = load_spec("smoke")
    data = smoke.model_dump(mode="json")
    data["target"]["local"]["vllm_python"] = "/elsewhere/python"
    assert spec_fingerprint(parse_spec(data)) == spec_fingerprint(smoke)
    tiny = load_spec("cpu-tiny")
    other = cpu_tiny(lambda d: d["target"]["local"].update(cpu_kvcache_gib=2))
    assert spec_fingerprint(parse_spec(other)) != spec_fingerprint(tiny)
