"""specs/gpu_share.py and the spec's checks of target.local.gpu_share: every engine of a configuration on one GPU,
each with a share of its memory that holds it; a layout that cannot fit is one line before anything starts."""
import pytest

from epdbench.specs.gpu_share import CONTEXT_GB, FILL, engine_needs, gpu_shares
from epdbench.specs.models import SpecError, load_spec, parse_spec


def gpu(mutate=None) -> dict:
    data = load_spec("gpu-qwen25vl").model_dump(mode="json")
    if mutate:
        mutate(data)
    return data


@pytest.fixture(scope="module")
def spec():
    return load_spec("gpu-qwen25vl")


def test_the_preset_shares_one_h100_among_up_to_three_engines(spec):
    shares = {c.name: gpu_shares(spec, c) for c in spec.configurations}
    assert shares == {"aggregated": {"server": 0.85}, "pd-nixl-tcp": {"prefill": 0.45, "decode": 0.45},
                      "pd-mooncake-tcp": {"prefill": 0.45, "decode": 0.45},      # the same pair, another connector
                      "epd": {"encode": 0.07, "prefill": 0.41, "decode": 0.41}}
    for c in spec.configurations:
        needs = engine_needs(spec, c)
        assert sum(shares[c.name][n.role] for n in needs) * 80 <= 80 * FILL - CONTEXT_GB * len(needs)
        for n in needs:
            assert shares[c.name][n.role] * 80 >= n.least_gb
    # a language-model engine: bf16 weights of 7.6 + 0.67 B parameters, the profiling reserve, one 16k sequence's KV
    lm = engine_needs(spec, spec.configuration("epd"))
    assert [round(n.least_gb, 2) for n in lm] == [4.84, 21.48, 21.48]
    assert spec.shares_one_gpu and spec.configuration("epd").gpus == 3 > spec.hardware.gpus_per_node


def test_an_encode_engine_with_the_whole_model_gets_the_room_for_it():
    spec = parse_spec(gpu(lambda d: d["target"]["local"].update(encode_vision_only=False)))
    assert gpu_shares(spec, spec.configuration("epd")) == {"encode": 0.26, "prefill": 0.31, "decode": 0.31}


def test_shares_given_per_role_replace_the_computed_ones_when_they_still_fit():
    spec = parse_spec(gpu(lambda d: d["target"]["local"].update(gpu_shares={"encode": 0.1, "prefill": 0.35})))
    assert gpu_shares(spec, spec.configuration("epd")) == {"encode": 0.1, "prefill": 0.35, "decode": 0.44}
    assert gpu_shares(spec, spec.configuration("pd-nixl-tcp")) == {"prefill": 0.35, "decode": 0.55}


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d["hardware"].update(hbm_gb=40),
     "field 'target.local.gpu_share': configuration pd-mooncake-tcp: 2 engines on one 40 GB GPU need at least 43.0 GB "
     "(prefill-0 21.5, decode-0 21.5; weights, profiling reserve and one 16384-token sequence's KV) of the 35.3 GB "
     "they may share: lower engine.max_model_len, drop a role, or use a GPU with more memory (hardware.hbm_gb)"),
    (lambda d: d["target"]["local"].update(gpu_shares={"prefill": 0.2}),
     "field 'target.local.gpu_share': configuration pd-mooncake-tcp: 2 engines on one 80 GB GPU: prefill's share 0.20 "
     "(16.0 GB) cannot hold its engine (21.5 GB): raise target.local.gpu_shares.prefill"),
    (lambda d: d["target"]["local"].update(gpu_shares={"prefill": 0.6, "decode": 0.6}),
     "field 'target.local.gpu_share': configuration pd-mooncake-tcp: 2 engines on one 80 GB GPU: the shares add up to "
     "1.20 of the GPU (96.0 GB), more than the 72.1 GB the engines may share: lower target.local.gpu_shares"),
    (lambda d: d["target"]["local"].update(gpu_shares={"decode": 1.5}),
     "field 'target.local': gpu_shares: decode 1.5 is not a share of the GPU's memory (0 < share < 1)"),
    (lambda d: d["target"]["local"].update(gpu_share=False),
     "field 'configurations.1' (pd-mooncake-tcp) needs 2 GPUs but 'hardware.gpus_per_node' is 1"),
    (lambda d: d["target"]["local"].update(device="cpu"),
     "field 'target.local': gpu_share puts the engines on GPU 0: it needs device cuda"),
    (lambda d: d["configurations"][0]["roles"][0].update(tp=2) or d["hardware"].update(gpus_per_node=2),
     "field 'configurations.0' (aggregated): target.local.gpu_share puts every engine on GPU 0: tp must be 1"),
    (lambda d: d["configurations"][3].update(ec_transport="tcp"),
     "field 'configurations.3' (epd): on the local target the encoder outputs go through a shared folder"),
])
def test_a_layout_one_gpu_cannot_hold_is_one_line_naming_the_field(mutate, problem):
    with pytest.raises(SpecError) as e:
        parse_spec(gpu(mutate), "gpu-qwen25vl")
    assert problem in str(e.value) and "\n" not in str(e.value)


def test_the_gpu_fields_leave_a_cpu_runs_fingerprint_alone_and_change_a_gpu_runs():
    from epdbench.specs.models import spec_fingerprint
    tiny = load_spec("cpu-tiny")
    assert spec_fingerprint(tiny) == "fb97ebc3ca05a1bf"       # as before the GPU lane's fields
    other = parse_spec(gpu(lambda d: d["target"]["local"].update(gpu_shares={"encode": 0.1})))
    assert spec_fingerprint(other) != spec_fingerprint(load_spec("gpu-qwen25vl"))


def test_per_gpu_figures_divide_by_the_one_gpu_the_engines_share(spec):
    assert [spec.gpus_used(c) for c in spec.configurations] == [1, 1, 1, 1]
    smoke = load_spec("epd-multimodal")
    assert [smoke.gpus_used(c) for c in smoke.configurations] == [1, 2, 3, 3]


def test_engines_starting_together_are_told_a_kv_cache_inside_their_share(spec):
    """start_together: each language-model engine of a configuration of several gets --kv-cache-memory-bytes, its
    share less its weights and the profiling reserve, and that still holds one max_model_len sequence; a lone
    engine, an encode engine and a layout started one after another are sized by vLLM's profiling."""
    from epdbench.specs.commands import local_engine_args, starts_together
    from epdbench.specs.gpu_share import LM_RESERVE_GB, kv_cache_bytes, weights_gb
    one_seq = spec.engine.max_model_len * spec.model.kv_bytes_per_token
    for c in spec.configurations:
        kv = kv_cache_bytes(spec, c)
        shares = gpu_shares(spec, c)
        assert set(kv) == {r.role for r in c.roles if r.role != "encode"}
        for role, size in kv.items():
            assert one_seq <= size <= (shares[role] * 80 - weights_gb(spec, role) - LM_RESERVE_GB) * 1e9
        args = {r.role: local_engine_args(spec, c, r, model="/m", port=1, ec_shared_dir="/dev/shm/x")
                for r in c.roles}
        for role, a in args.items():
            given = a[a.index("--kv-cache-memory-bytes") + 1] if "--kv-cache-memory-bytes" in a else None
            assert given == (str(kv[role]) if starts_together(spec, c) and role != "encode" else None), (c.name, role)
    assert [starts_together(spec, c) for c in spec.configurations] == [c.name != "aggregated"
                                                                        for c in spec.configurations]
    apart = parse_spec(gpu(lambda d: d["target"]["local"].update(start_together=False)))
    assert not any(starts_together(apart, c) for c in apart.configurations)
    from epdbench.specs.models import spec_fingerprint
    assert spec_fingerprint(apart) != spec_fingerprint(spec)          # another way to start: another fingerprint
