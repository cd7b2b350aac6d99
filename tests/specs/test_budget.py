"""specs/budget.py: every configuration scaled to a GPU budget (replicas × floor(budget / its GPUs)), what was done
kept in the resolved spec, resolving idempotent, and a budget that cannot work refused in one line naming the field
(or the flag) and the fix."""
from __future__ import annotations

import pytest
import yaml

from epdbench.specs.budget import as_written, resolve_gpu_budget, scale_to_budget
from epdbench.specs.cost import BudgetScale
from epdbench.specs.models import (SpecError, load_spec, parse_spec, resume_changes, spec_fingerprint,
                                   spec_to_yaml)


def budgeted(name: str, budget: int | None, mutate=None):
    """A preset with cost.gpu_budget set (not yet resolved)."""
    data = load_spec(name).model_dump(mode="json")
    data["cost"]["gpu_budget"] = budget
    if mutate:
        mutate(data)
    return parse_spec(data)


def replicas(spec) -> dict[str, dict[str, int]]:
    return {c.name: {r.role: r.replicas for r in c.roles} for c in spec.configurations}


def refusal(fn, *args) -> str:
    with pytest.raises(SpecError) as exc:
        fn(*args)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_the_unequal_preset_at_six_gpus_runs_every_configuration_on_six():
    spec = load_spec("epd-multimodal")
    assert {c.name: c.gpus for c in spec.configurations} == {"aggregated": 1, "pd-tcp": 2, "epd": 3, "epd-rdma": 3}
    six = resolve_gpu_budget(budgeted("epd-multimodal", 6))
    assert replicas(six) == {"aggregated": {"server": 6}, "pd-tcp": {"prefill": 3, "decode": 3},
                             "epd": {"encode": 2, "prefill": 2, "decode": 2},
                             "epd-rdma": {"encode": 2, "prefill": 2, "decode": 2}}
    assert {c.name: c.gpus for c in six.configurations} == dict.fromkeys(replicas(six), 6)
    assert six.cost.budget_scales == [BudgetScale(configuration="aggregated", gpus=1, scale=6),
                                      BudgetScale(configuration="pd-tcp", gpus=2, scale=3),
                                      BudgetScale(configuration="epd", gpus=3, scale=2),
                                      BudgetScale(configuration="epd-rdma", gpus=3, scale=2)]
    rdma = six.configuration("epd-rdma")       # per replica: TP and NICs as written
    assert [(r.tp, r.rdma_interfaces) for r in rdma.roles] == \
        [(r.tp, r.rdma_interfaces) for r in spec.configuration("epd-rdma").roles]
    assert spec_fingerprint(six) != spec_fingerprint(spec)     # other deployments: another history


def test_a_budget_a_configuration_cannot_fill_leaves_the_rest_unused():
    four = resolve_gpu_budget(budgeted("epd-multimodal", 4))
    assert {c.name: c.gpus for c in four.configurations} == {"aggregated": 4, "pd-tcp": 4, "epd": 3, "epd-rdma": 3}
    assert {s.configuration: s.scale for s in four.cost.budget_scales} == \
        {"aggregated": 4, "pd-tcp": 2, "epd": 1, "epd-rdma": 1}


def test_a_preset_already_at_the_budget_deploys_as_written_and_keeps_its_fingerprint():
    spec = load_spec("pd-text")
    six = resolve_gpu_budget(budgeted("pd-text", 6))
    assert six.configurations == spec.configurations
    assert {s.scale for s in six.cost.budget_scales} == {1} and spec_fingerprint(six) == spec_fingerprint(spec)


def test_no_budget_leaves_the_spec_as_it_is():
    spec = load_spec("smoke")
    assert resolve_gpu_budget(spec) is spec


def test_resolving_is_idempotent_and_survives_the_runs_spec_yaml():
    six = resolve_gpu_budget(budgeted("epd-multimodal", 6))
    assert resolve_gpu_budget(six) is six
    stored = parse_spec(yaml.safe_load(spec_to_yaml(six)))          # the results folder's spec.yaml, read back
    assert stored == six and resolve_gpu_budget(stored) == six
    assert resume_changes(stored, resolve_gpu_budget(stored, 6, "--gpu-budget")) == []


def test_a_new_budget_scales_the_configurations_as_written_not_the_scaled_ones():
    six = resolve_gpu_budget(budgeted("epd-multimodal", 6))
    assert as_written(six) == load_spec("epd-multimodal").configurations
    four = resolve_gpu_budget(six, 4, "--gpu-budget")
    assert four == resolve_gpu_budget(budgeted("epd-multimodal", 4))
    changes = resume_changes(six, four)          # a resume at another budget measures other deployments
    assert changes and changes[0].startswith("configurations[aggregated].roles[0].replicas: 6 → 4")


def test_choosing_configurations_first_lets_a_smaller_budget_fit():
    spec = budgeted("epd-multimodal", 2)
    chosen = spec.model_copy(update={"configurations": spec.configurations[:2]})
    assert {c.name: c.gpus for c in resolve_gpu_budget(chosen).configurations} == {"aggregated": 2, "pd-tcp": 2}


def test_a_budget_below_a_configuration_names_them_and_the_least_budget():
    msg = refusal(resolve_gpu_budget, budgeted("epd-multimodal", 2))
    assert msg == ("field 'cost.gpu_budget' (2): epd (3), epd-rdma (3) need more GPUs than the budget, so cannot run "
                   "even once: give a budget of at least 3, or leave them out (--configs)")
    msg = refusal(resolve_gpu_budget, load_spec("epd-multimodal"), 2, "--gpu-budget")
    assert msg.startswith("--gpu-budget 2: epd (3), epd-rdma (3) need more GPUs than the budget")


def test_a_budget_beyond_the_node_is_refused():
    msg = refusal(resolve_gpu_budget, load_spec("smoke"), 9, "--gpu-budget")
    assert msg == ("--gpu-budget 9 exceeds 'hardware.gpus_per_node' (8): a configuration runs on one node; give a "
                   "budget of at most 8, or a bigger node")


@pytest.mark.parametrize("budget", [0, -3])
def test_a_budget_below_one_is_refused(budget):
    assert refusal(resolve_gpu_budget, load_spec("smoke"), budget, "--gpu-budget") == \
        f"--gpu-budget {budget}: give the GPUs every configuration may use, 1 or more (e.g. 6)"
    with pytest.raises(SpecError, match="cost.gpu_budget.*greater than or equal to 1"):
        budgeted("smoke", budget)


def test_engines_sharing_one_gpu_on_the_local_target_refuse_a_budget():
    spec = load_spec("gpu-qwen25vl")
    assert spec.shares_one_gpu
    msg = refusal(resolve_gpu_budget, spec, 3, "--gpu-budget")
    assert msg == ("--gpu-budget 3: target.local.gpu_share runs every engine of a configuration on one GPU, so each "
                   "configuration counts one GPU and a budget has nothing to scale: drop the budget, or set "
                   "target.local.gpu_share false to give every engine its own GPU")


def test_on_the_simulator_a_shared_gpu_spec_scales_past_its_one_gpu_node_up_to_the_replica_limit():
    spec = budgeted("gpu-qwen25vl", None, lambda d: d["target"].update(kind="sim"))
    assert spec.hardware.gpus_per_node == 1 and not spec.shares_one_gpu
    six = resolve_gpu_budget(spec, 6, "--gpu-budget")       # the spec's own check lets the simulator model a GPU each
    assert {c.name: c.gpus for c in six.configurations} == {"aggregated": 6, "pd-mooncake-tcp": 6, "pd-nixl-tcp": 6,
                                                           "epd": 6}
    msg = refusal(resolve_gpu_budget, spec, 17, "--gpu-budget")
    assert msg == ("--gpu-budget 17: aggregated ×17 would run 17 replicas of one role, more than the 16 a role may "
                   "have: give a budget of at most 16")


def test_the_replica_limit_counts_a_roles_own_replicas():
    spec = budgeted("smoke", None, lambda d: d["target"]["local"].update(gpu_share=True, device="cuda"))
    spec = spec.model_copy(update={"configurations": spec.configurations[:1]})    # aggregated: 2 servers, 2 GPUs
    scaling = scale_to_budget(spec.configurations, 17, 8, gpu_share=True)
    assert [r.replicas for r in scaling.configurations[0].roles] == [16]
    with pytest.raises(SpecError, match=r"aggregated ×9 would run 18 replicas .* at most 17$"):
        scale_to_budget(spec.configurations, 18, 8, gpu_share=True)


def test_a_recorded_scaling_must_match_its_budget_and_its_configurations():
    six = resolve_gpu_budget(budgeted("epd-multimodal", 6)).model_dump(mode="json")
    no_budget = {**six, "cost": {**six["cost"], "gpu_budget": None}}
    assert "gpu_budget is empty" in refusal(parse_spec, no_budget)
    other = {**six, "cost": {**six["cost"], "gpu_budget": 8}}
    assert refusal(parse_spec, other).startswith("spec: field 'cost': budget_scales: aggregated ×6 of 1 GPU is not "
                                                 "what gpu_budget 8 gives (×8)")
    edited = parse_spec(six)
    roles = [r.model_copy(update={"replicas": 5}) for r in edited.configurations[0].roles]
    edited = edited.model_copy(update={"configurations": [edited.configurations[0].model_copy(update={"roles": roles}),
                                                          *edited.configurations[1:]]})
    assert refusal(resolve_gpu_budget, edited) == ("field 'cost.budget_scales': configuration aggregated is not 1 GPU "
                                                   "×6: drop budget_scales (epdbench writes it) and give the "
                                                   "configurations as written")


# --- on the command line: `compare --gpu-budget N` and the spec's field, as compare and manifests deploy them ---


def test_the_flag_scales_the_configurations_compare_runs_and_overrides_the_field(started_with, tmp_path):
    spec = started_with("--clock", "virtual", "--spec", "epd-multimodal", "--gpu-budget", "6")
    assert spec == resolve_gpu_budget(budgeted("epd-multimodal", 6, lambda d: d["target"]["sim"].update(
        clock="virtual")))
    path = tmp_path / "four.yaml"
    path.write_text(spec_to_yaml(budgeted("epd-multimodal", 4)))         # the field, not yet resolved
    assert {c.name: c.gpus for c in started_with("--clock", "virtual", "--spec", str(path)).configurations} == \
        {"aggregated": 4, "pd-tcp": 4, "epd": 3, "epd-rdma": 3}
    again = started_with("--clock", "virtual", "--spec", str(path), "--gpu-budget", "6")
    assert again.cost.gpu_budget == 6 and replicas(again) == replicas(spec)
    chosen = started_with("--clock", "virtual", "--spec", "epd-multimodal", "--gpu-budget", "2", "--configs", "aggregated,pd-tcp")
    assert {c.name: c.gpus for c in chosen.configurations} == {"aggregated": 2, "pd-tcp": 2}
    assert started_with("--clock", "virtual", "--spec", "epd-multimodal").configurations == load_spec("epd-multimodal").configurations


@pytest.mark.parametrize("value, why", [
    ("2", "--gpu-budget 2: epd (3), epd-rdma (3) need more GPUs than the budget, so cannot run even once: give a "
          "budget of at least 3, or leave them out (--configs)"),
    ("0", "--gpu-budget 0: give the GPUs every configuration may use, 1 or more (e.g. 6)"),
    ("9", "--gpu-budget 9 exceeds 'hardware.gpus_per_node' (8)"),
    ("six", "epdbench compare: argument --gpu-budget: invalid int value: 'six'")])
def test_a_budget_that_cannot_work_is_refused_in_one_line_before_anything_starts(value, why, capsys, monkeypatch,
                                                                                 tmp_path):
    from epdbench.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--spec", "epd-multimodal", "--clock", "virtual", "--gpu-budget", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {why}"), err
    assert len(err.splitlines()) == 1 and not (tmp_path / "results").exists()


def test_the_kubernetes_manifests_of_a_budgeted_spec_deploy_the_scaled_replicas(tmp_path):
    from epdbench.cli import main

    path = tmp_path / "six.yaml"
    path.write_text(spec_to_yaml(budgeted("epd-multimodal", 6)))
    assert main(["manifests", "--spec", str(path), "--config", "pd-tcp", "--out", str(tmp_path / "m")]) == 0
    sets = {d["metadata"]["name"]: d["spec"]["replicas"] for f in sorted((tmp_path / "m" / "pd-tcp").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d["kind"] == "StatefulSet"}
    assert sets == {"pd-tcp-prefill": 3, "pd-tcp-decode": 3}
