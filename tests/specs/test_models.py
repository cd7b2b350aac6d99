"""specs/models.py: presets load, every field is documented, bad input is one clear SpecError line."""
from __future__ import annotations

import re
import copy
import typing

import pytest
from pydantic import BaseModel

from epdbench.specs.models import (PRESET_DIR, ExperimentSpec, SpecError, load_spec, parse_spec, resolve_spec_path,
                          select_configurations, spec_to_yaml)

PRESETS = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def base_spec() -> dict:
    """A small valid spec: one vision model, one aggregated configuration, one fixed suite."""
    return {
        "name": "unit",
        "model": {"name": "toy/vl", "params_b": 1.0, "n_layers": 4, "hidden_size": 256, "n_heads": 4,
                  "n_kv_heads": 2, "head_dim": 64, "vision": {"params_b": 0.1, "embed_dim": 256}},
        "hardware": {"gpu": "toy", "gpus_per_node": 4, "bf16_tflops": 100, "hbm_tb_s": 1.0, "nvlink_gb_s": 100,
                     "tcp_gb_s": 1.0, "rdma_nic_gbit_s": 100},
        "configurations": [{"name": "aggregated", "topology": "aggregated", "roles": [{"role": "server"}]}],
        "suites": [{"kind": "fixed", "name": "fixed", "shapes": [{"input_tokens": 32, "output_tokens": 4}],
                    "concurrencies": [1]}],
    }


def with_(mutate) -> dict:
    data = copy.deepcopy(base_spec())
    mutate(data)
    return data


def test_base_spec_is_valid():
    spec = parse_spec(base_spec())
    assert spec.configurations[0].gpus == 1


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_round_trips(name):
    spec = load_spec(name)
    assert isinstance(spec, ExperimentSpec)
    assert spec.name == name
    # The resolved YAML written to results/ must parse back to the same spec.
    import yaml
    assert parse_spec(yaml.safe_load(spec_to_yaml(spec))) == spec


def test_there_is_at_least_the_smoke_preset():
    assert "smoke" in PRESETS


def _models_in(annotation) -> list[type[BaseModel]]:
    """Pydantic models inside an annotation: list/dict/Union/Optional/Annotated members included."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _reachable_models(root: type[BaseModel]) -> dict[type[BaseModel], None]:
    seen: dict[type[BaseModel], None] = {}
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen[model] = None
        for field in model.model_fields.values():
            todo += _models_in(field.annotation)
    return seen


def test_field_walk_reaches_every_concern():
    names = {m.__name__ for m in _reachable_models(ExperimentSpec)}
    assert names >= {"ExperimentSpec", "ModelSpec", "VisionSpec", "HardwareSpec", "EngineSpec", "ConfigurationSpec",
                     "RoleSpec", "FixedSuite", "Shape", "MultimodalSuite", "ImageCell", "TargetSpec",
                     "SimTargetSpec", "TrackingSpec"}


@pytest.mark.parametrize("model", list(_reachable_models(ExperimentSpec)), ids=lambda m: m.__name__)
def test_every_field_has_title_and_description(model):
    undocumented = [name for name, f in model.model_fields.items()
                    if not (f.title or "").strip() or not (f.description or "").strip()]
    assert undocumented == []


@pytest.mark.parametrize("model", list(_reachable_models(ExperimentSpec)), ids=lambda m: m.__name__)
def test_every_model_forbids_unknown_fields(model):
    assert model.model_config.get("extra") == "forbid"


def _error(data: dict) -> str:
    with pytest.raises(SpecError) as exc:
        parse_spec(data, "unit.yaml")
    msg = str(exc.value)
    assert "\n" not in msg, "a SpecError must be one line"
    assert msg.startswith("unit.yaml: ")
    return msg


def test_aggregated_with_tcp_transport_is_rejected():
    msg = _error(with_(lambda d: d["configurations"][0].update(kv_transport="tcp")))
    assert "configurations.0" in msg and "kv_transport" in msg


def test_pd_without_decode_role_is_rejected():
    msg = _error(with_(lambda d: d["configurations"].append(
        {"name": "pd-tcp", "topology": "pd", "kv_transport": "tcp", "roles": [{"role": "prefill"}]})))
    assert "configurations.1" in msg and "decode" in msg


def test_pd_rdma_without_rdma_interfaces_is_rejected():
    msg = _error(with_(lambda d: d["configurations"].append(
        {"name": "pd-rdma", "topology": "pd", "kv_transport": "rdma",
         "roles": [{"role": "prefill", "rdma_interfaces": 0}, {"role": "decode", "rdma_interfaces": 1}]})))
    assert "configurations.1" in msg and "rdma_interfaces" in msg and "prefill" in msg


def test_configuration_needing_more_gpus_than_the_node_is_rejected():
    msg = _error(with_(lambda d: d["configurations"][0]["roles"][0].update(replicas=3, tp=2)))
    assert "aggregated" in msg and "6 GPUs" in msg and "4" in msg


def test_a_tp_vllm_cannot_shard_the_model_over_is_rejected_naming_the_role_and_the_valid_ones():
    base = parse_spec(with_(lambda d: None))
    heads = base.model.n_heads
    tp = next(t for t in range(2, heads + 1) if heads % t)
    msg = _error(with_(lambda d: d["configurations"][0]["roles"][0].update(tp=tp)))
    assert f"field 'configurations.0.roles.0.tp' (aggregated, server): TP {tp} cannot serve" in msg
    assert f"divide the model's {heads} attention heads; use TP " in msg


@pytest.mark.parametrize("heads, kv_heads, valid", [
    (64, 8, [1, 2, 4, 8, 16, 32, 64]),      # Qwen3-32B
    (28, 4, [1, 2, 4, 28]),                 # Qwen2.5-VL-7B: 7 and 14 divide the heads, not the KV heads' 4
    (32, 2, [1, 2, 4, 8, 16, 32]),          # TP above the KV heads replicates them
])
def test_tp_sizes_follow_vllms_head_rules(heads, kv_heads, valid):
    model = load_spec("smoke").model.model_copy(update={"n_heads": heads, "n_kv_heads": kv_heads})
    assert model.valid_tps(64) == valid


def test_a_tp_problem_names_the_rule_it_breaks():
    model = load_spec("smoke").model                        # Qwen2.5-VL-7B: 28 heads, 4 KV heads
    assert model.tp_problem(3) == "vLLM needs it to divide the model's 28 attention heads"
    assert model.tp_problem(7).startswith("vLLM splits the model's 4 KV heads over TP (or replicates them)")
    assert model.tp_problem(2) is model.tp_problem(4) is None


def test_a_token_budget_below_max_num_seqs_is_rejected_as_vllm_does():
    msg = _error(with_(lambda d: d.setdefault("engine", {}).update(max_num_batched_tokens=64, max_num_seqs=128)))
    assert ("field 'engine.max_num_batched_tokens' (64) must be greater than or equal to 'engine.max_num_seqs' "
            "(128)") in msg


def test_a_workload_longer_than_the_context_is_rejected_before_vllm_would_cut_its_outputs():
    def engine(max_model_len):
        return lambda d: d.setdefault("engine", {}).update(max_model_len=max_model_len)

    def both(*mutations):
        return lambda d: [m(d) for m in mutations]
    def shape(prompt):
        return lambda d: d["suites"][0]["shapes"][0].update(input_tokens=prompt)
    assert parse_spec(with_(both(shape(60), engine(64)))).engine.max_model_len == 64   # 60 + 4 output: fits
    assert ("field 'suites.0' (fixed): workload 61/4 asks for up to 61 prompt and 4 output tokens, more than "
            "'engine.max_model_len' (64): vLLM would cut their outputs to 3 tokens") in _error(
        with_(both(shape(61), engine(64))))

    def long_stream(d):                                                  # a ranged stream: its longest prompt
        d["suites"] = [{"kind": "mixed", "name": "mixed", "streams": [
            {"name": "s", "input_tokens_min": 8, "input_tokens_max": 200, "output_tokens": 4, "n_requests": 2,
             "concurrency": 1}]}]
    msg = _error(with_(both(long_stream, engine(128))))
    assert "up to 200 prompt and 4 output tokens" in msg and "vLLM would refuse prompts that long" in msg

    def image(d):                                                        # a chat prompt counts its image's tokens
        d["model"]["chat_overhead_tokens"] = 10
        d["suites"] = [{"kind": "multimodal", "name": "mm", "concurrencies": [1],
                        "cells": [{"name": "a", "image_px": 280, "text_tokens": 80, "output_tokens": 8}]}]
    assert parse_spec(with_(both(image, engine(198)))).engine.max_model_len == 198   # 80 + 10 + 10² image tokens
    assert "up to 190 prompt and 8 output tokens" in _error(with_(both(image, engine(197))))


def test_multimodal_suite_on_text_only_model_is_rejected():
    def mutate(d):
        d["model"].pop("vision")
        d["suites"].append({"kind": "multimodal", "name": "mm", "concurrencies": [1],
                            "cells": [{"name": "1k", "image_px": 560, "text_tokens": 8, "output_tokens": 2}]})
    msg = _error(with_(mutate))
    assert "mm" in msg and "vision" in msg


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["configurations"][0]["roles"][0].update(replicas=3, tp=2), ("configurations.0", "gpus_per_node")),
    (lambda d: (d["model"].pop("vision"), d["suites"].append(
        {"kind": "multimodal", "name": "mm", "concurrencies": [1],
         "cells": [{"name": "1k", "image_px": 560, "text_tokens": 8, "output_tokens": 2}]})),
     ("model.vision", "suites.1")),
], ids=["gpus", "vision"])
def test_cross_field_errors_name_a_field_path(mutate, field):
    msg = _error(with_(mutate))
    assert "(top level)" not in msg
    assert any(f in msg for f in field)


@pytest.mark.parametrize("where, mutate", [
    ("bogus", lambda d: d.update(bogus=1)),
    ("hardware.hbm_tbs", lambda d: d["hardware"].update(hbm_tbs=3.35)),
    ("configurations.0.roles.0.gpus", lambda d: d["configurations"][0]["roles"][0].update(gpus=1)),
])
def test_unknown_field_is_rejected_naming_it(where, mutate):
    msg = _error(with_(mutate))
    assert f"'{where}'" in msg and "Extra inputs are not permitted" in msg


@pytest.mark.parametrize("mutate, where, meant", [
    (lambda d: d.update(seeed=d.pop("seed", 0)), "seeed", "seed"),
    (lambda d: d["hardware"].update(hbm_tbs=3.35), "hardware.hbm_tbs", "hbm_tb_s"),
    (lambda d: d["configurations"][0]["roles"][0].update(replica=2), "configurations.0.roles.0.replica", "replicas"),
    (lambda d: d["suites"][0].update(concurrency=[1]), "suites.0.fixed.concurrency", "concurrencies"),
    (lambda d: d["suites"][0]["shapes"][0].update(input_token=8), "suites.0.fixed.shapes.0.input_token",
     "input_tokens"),
    (lambda d: d.setdefault("target", {}).setdefault("local", {}).update(devise="cpu"), "target.local.devise",
     "device"),
], ids=["top", "nested", "list", "union-member", "list-in-union", "target"])
def test_a_misspelt_field_is_named_with_the_one_meant(mutate, where, meant):
    assert _error(with_(mutate)).endswith(
        f"field '{where}': Extra inputs are not permitted (did you mean '{meant}'?)")


def test_a_field_close_to_none_gets_no_guess():
    assert _error(with_(lambda d: d.update(bogus=1))) == "unit.yaml: field 'bogus': Extra inputs are not permitted"


def test_select_configurations_keeps_named_ones_and_rejects_unknown():
    spec = parse_spec(with_(lambda d: d["configurations"].append(
        {"name": "pd-tcp", "topology": "pd", "kv_transport": "tcp",
         "roles": [{"role": "prefill"}, {"role": "decode"}]})))
    assert select_configurations(spec, None) is spec
    assert [c.name for c in select_configurations(spec, ["pd-tcp"]).configurations] == ["pd-tcp"]
    with pytest.raises(SpecError) as exc:
        select_configurations(spec, ["pd-rdma"])
    msg = str(exc.value)
    assert "\n" not in msg
    assert "pd-rdma" in msg and "aggregated" in msg and "pd-tcp" in msg


def test_resolve_spec_path_unknown_preset():
    with pytest.raises(SpecError) as exc:
        resolve_spec_path("no-such-preset-xyz")
    msg = str(exc.value)
    assert "no-such-preset-xyz" in msg and "smoke" in msg and "\n" not in msg


def test_load_spec_from_a_yaml_path_reports_path_and_field(tmp_path):
    import yaml
    bad = base_spec()
    bad["trials"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError) as exc:
        load_spec(str(path))
    assert str(path) in str(exc.value) and "'trials'" in str(exc.value)


def test_engine_and_router_cpu_memory_defaults_leave_engines_unset_and_size_the_router():
    kube = parse_spec(base_spec()).target.kubernetes
    assert (kube.engine.cpu, kube.engine.memory) == (None, None)
    assert (kube.router.cpu, kube.router.memory) == ("2", "1Gi")
    kube = parse_spec(with_(lambda d: d.update(target={"kubernetes": {
        "engine": {"cpu": "7500m", "memory": "64Gi"}, "router": {"cpu": None, "memory": None},
        "loadgen": {"cpu": "500m"}}}))).target.kubernetes
    assert (kube.engine.cpu, kube.engine.memory, kube.router.cpu, kube.loadgen.cpu) == ("7500m", "64Gi", None, "500m")


@pytest.mark.parametrize("where, value", [("engine.cpu", "2Gi"), ("engine.memory", "512m"), ("router.cpu", "one"),
                                          ("router.memory", "1GB"), ("loadgen.cpu", "2k")])
def test_malformed_cpu_or_memory_is_rejected_naming_the_field(where, value):
    section, field = where.split(".")
    msg = _error(with_(lambda d: d.update(target={"kubernetes": {section: {field: value}}})))
    assert f"'target.kubernetes.{where}'" in msg


@pytest.mark.parametrize("field, mutate", [
    ("suites.0.fixed.concurrencies.0", lambda d: d["suites"][0].update(concurrencies=[-1])),
    ("suites.0.fixed.concurrencies.1", lambda d: d["suites"][0].update(concurrencies=[1, 0])),
    ("suites.0.fixed.n_measured_by_concurrency.1", lambda d: d["suites"][0].update(n_measured_by_concurrency={1: 0})),
    ("suites.0.fixed.n_measured_by_concurrency.-2.[key]",
     lambda d: d["suites"][0].update(n_measured_by_concurrency={-2: 4})),
    ("suites.0.fixed.shapes.0.input_tokens", lambda d: d["suites"][0]["shapes"][0].update(input_tokens=0)),
    ("request_timeout_s", lambda d: d.update(request_timeout_s=0)),
    ("hardware.compute_efficiency", lambda d: d["hardware"].update(compute_efficiency=1.5)),
])
def test_every_count_and_bound_is_checked_naming_the_field(field, mutate):
    msg = _error(with_(mutate))
    assert f"'{field}'" in msg and "\n" not in msg


@pytest.mark.parametrize("text, where", [
    ("name: x\nseed: [1\n", "line 3, column 1"),
    ("name: x\n  seed: 1\n", "line 2, column 7"),
])
def test_malformed_yaml_names_line_and_column(tmp_path, text, where):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as exc:
        load_spec(str(path))
    msg = str(exc.value)
    assert msg.startswith(f"{path}: not valid YAML at {where}: ") and "\n" not in msg


def test_spec_changes_names_each_changed_field_with_its_values():
    from epdbench.specs.models import select_configurations, spec_changes, spec_fingerprint

    spec = load_spec("smoke")
    assert spec_changes(spec, spec) == []
    data = spec.model_dump(mode="json")
    data["seed"] = 9
    data["hardware"]["compute_efficiency"] = 0.42
    data["suites"][0]["concurrencies"] = [1, 2]
    data["tracking"]["experiment"] = "elsewhere"                # where results go: not a change of the run
    data["description"] = "other words"
    other = parse_spec(data)
    assert spec_changes(spec, other) == ["seed: 0 → 9", "hardware.compute_efficiency: 0.5 → 0.42",
                                         f"suites[{spec.suites[0].name}].concurrencies: [1, 8] → [1, 2]"]
    assert spec_changes(spec, other, most=1) == ["seed: 0 → 9", "2 more"]
    two = select_configurations(spec, ["aggregated", "pd-tcp"])
    assert spec_changes(spec, two) == ["configurations[pd-rdma]: removed", "configurations[epd]: removed"]
    assert spec_changes(two, spec) == ["configurations[pd-rdma]: added", "configurations[epd]: added"]
    # what it compares is what the fingerprint covers
    same = parse_spec({**spec.model_dump(mode="json"), "description": "x", "tracking": data["tracking"]})
    assert spec_changes(spec, same) == [] and spec_fingerprint(spec) == spec_fingerprint(same)
    data["suites"][0]["concurrencies"] = list(range(1, 40))  # a long value is cut short
    (shown,) = [c for c in spec_changes(spec, parse_spec(data)) if c.startswith("suites")]
    assert shown.endswith("→ [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,…") and len(shown) < 100


def test_the_clock_leaves_real_clock_fingerprints_as_they_were_before_it_existed():
    """Nightly history matches runs on spec_fingerprint: a spec that does not choose the virtual clock keeps the
    fingerprint it had before target.sim.clock existed (these are those values, on the roofline laws of then),
    and a virtual run never shares one with a real-clock run."""
    from epdbench.specs.models import spec_fingerprint

    def on_roofline(name: str):     # the physics before the measured operator laws (smoke as it was then)
        spec = load_spec(name)
        if name == "smoke":
            spec = spec.model_copy(update={"trials": 1, "target": spec.target.model_copy(update={
                "sim": spec.target.sim.model_copy(update={"clock": "real"})})})
        return spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"op_laws": "roofline"})})
    assert spec_fingerprint(on_roofline("smoke")) == "e6e477e02c20d0f8"
    assert spec_fingerprint(on_roofline("pd-text")) == "0f0776c909fa885a"
    data = on_roofline("smoke").model_dump(mode="json")
    data["target"]["sim"]["clock"] = "virtual"
    virtual = parse_spec(data)
    assert virtual.virtual and virtual.time_scale == 1.0
    assert spec_fingerprint(virtual) != "e6e477e02c20d0f8"


def test_the_measured_operator_laws_give_every_preset_a_new_fingerprint():
    """Physics changed: runs on the roofline laws are not the measured laws' history."""
    from epdbench.specs.models import spec_fingerprint
    for name in ("smoke", "pd-text"):
        spec = load_spec(name)
        roofline = spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"op_laws": "roofline"})})
        faster = spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"measured_hbm_factor": 1.1})})
        assert len({spec_fingerprint(s) for s in (spec, roofline, faster)}) == 3


@pytest.mark.parametrize("sim, problem", [
    ({"kv_engine": "mooncake"}, "field 'target.sim.kv_engine' (mooncake) moves real bytes between processes"),
    ({"faults": {"kill_replica": "server-0"}}, "field 'target.sim.faults' injects faults into simulator processes"),
    ({"faults": {"skip_prefill_fraction": 0.5}}, "field 'target.sim.faults' injects faults"),
])
def test_what_needs_processes_is_refused_in_virtual_time(sim, problem):
    data = load_spec("smoke").model_dump(mode="json")
    data["target"]["sim"].update({"clock": "virtual", **sim})
    with pytest.raises(SpecError, match=re.escape(problem)):
        parse_spec(data)


def test_the_dcgm_exporter_leaves_fingerprints_as_they_were_unless_another_is_named():
    """GPU telemetry's source (target.kubernetes.dcgm_exporter) at its default keeps every fingerprint as before the
    field; naming another is a change spec_changes shows."""
    from epdbench.specs.models import spec_changes, spec_fingerprint

    spec = load_spec("pd-text")
    data = spec.model_dump(mode="json")
    data["target"]["kubernetes"].pop("dcgm_exporter")
    assert spec_fingerprint(parse_spec(data)) == spec_fingerprint(spec)
    data["target"]["kubernetes"]["dcgm_exporter"] = "monitoring/dcgm-exporter:metrics"
    other = parse_spec(data)
    assert spec_fingerprint(other) != spec_fingerprint(spec)
    assert spec_changes(spec, other) == ['target.kubernetes.dcgm_exporter: "gpu-operator/nvidia-dcgm-exporter:9400"'
                                         ' → "monitoring/dcgm-exporter:metrics"']
    with pytest.raises(SpecError, match="dcgm_exporter"):
        data["target"]["kubernetes"]["dcgm_exporter"] = "nvidia-dcgm-exporter"
        parse_spec(data)
