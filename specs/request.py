"""What a user asks for from the Prefect UI (or a schedule): a preset plus overrides. The form is
built from this model, so bad input is refused before a run starts. Resolving it is pure."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from epdbench.specs.models import ExperimentSpec, SpecError, load_spec, parse_spec, select_configurations
from epdbench.specs.budget import resolve_gpu_budget
from epdbench.specs.profile import apply_profile, load_profile

Preset = Literal["smoke", "pd-text", "epd-multimodal", "epd-reuse", "pd-nixl"]
ConfigName = Literal["aggregated", "pd-tcp", "pd-rdma", "epd", "epd-rdma"]
SuiteName = Literal["fixed", "mixed", "capacity", "mm-context", "mm-mixed", "mm-reuse"]


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: Preset = Field("smoke", title="Preset", description="Workload and deployment preset to run.")
    configurations: list[ConfigName] = Field(
        default_factory=list, title="Configurations",
        description="Which configurations to compare; empty: every configuration of the preset.")
    suites: list[SuiteName] = Field(default_factory=list, title="Suites",
                                    description="Which suites to run; empty: every suite of the preset.")
    trials: int | None = Field(None, ge=1, le=20, title="Trials",
                               description="Repetitions of every cell; empty: the preset's.")
    seed: int | None = Field(None, ge=0, title="Seed", description="Prompt/image seed; empty: the preset's.")
    target: Literal["sim", "kubernetes"] = Field("sim", title="Target",
                                                 description="sim: embedded simulator; kubernetes: the cluster.")
    clock: Literal["real", "virtual"] | None = Field(
        None, title="Simulator clock",
        description="real: simulator processes over HTTP; virtual: the same model in virtual time, every preset "
                    "in seconds, its figures labelled virtual (sim target only); empty: the preset's (smoke: "
                    "virtual, the others: real).")
    model: str | None = Field(None, min_length=1, title="Model override",
                              description="Serve another model id (same architecture figures as the preset).")
    engine_image: str | None = Field(None, min_length=1, title="Engine image override",
                                     description="vllm/vllm-openai image:tag for the Kubernetes target.")
    namespace: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", title="Namespace",
                                  description="Kubernetes namespace (Kubernetes target).")
    run_key: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$", title="Run key",
                                description="Name of the results folder; re-running with the same key resumes "
                                            "it, skipping cells already recorded.")
    gpu_hour_usd: float | None = Field(None, ge=0, allow_inf_nan=False, title="Price per GPU-hour (USD)",
                                       description="For the report's cost per million output tokens; empty: the "
                                                   "preset's (none: no cost figures).")
    gpu_budget: int | None = Field(None, ge=1, le=64, title="GPU budget",
                                   description="GPUs every configuration may use: each one's replicas scaled by "
                                               "floor(budget / its GPUs), so all are measured on about the same "
                                               "number of GPUs; empty: the configurations as written.")
    profile: str | None = Field(None, min_length=1, title="Calibration profile",
                                description="Path, on the machine that runs the flow, of a profile written by "
                                            "epdbench calibrate: the simulator's constants come from it (sim "
                                            "target only; the run keeps it as profile.yaml).")


def request_profile(req: RunRequest) -> dict | None:
    """The calibration profile a request names (None without one); SpecError (one line) when it cannot be read
    or the target is not the simulator."""
    if req.profile is None:
        return None
    if req.target != "sim":
        raise SpecError(f"profile: a calibration profile sets the simulator's physics; it does not apply to "
                        f"target {req.target}")
    return load_profile(req.profile, "profile")


def resolve_request(req: RunRequest, profile: dict | None = None) -> ExperimentSpec:
    """The experiment spec a request stands for, with its profile's constants (`profile`: request_profile(req)
    when the caller has it already); SpecError (one line) when the combination is invalid."""
    profile = profile if profile is not None else request_profile(req)
    spec = load_spec(req.preset)
    data = spec.model_dump(mode="json")
    if req.suites:
        unknown = [s for s in req.suites if s not in {x["name"] for x in data["suites"]}]
        if unknown:
            raise SpecError(f"suites: {', '.join(unknown)} not in preset {req.preset}")
        data["suites"] = [s for s in data["suites"] if s["name"] in req.suites]
    for key, value in (("trials", req.trials), ("seed", req.seed)):
        if value is not None:
            data[key] = value
    if req.model:
        data["model"]["name"] = req.model
    data["target"]["kind"] = req.target
    if req.clock == "virtual" and req.target != "sim":
        raise SpecError(f"clock: virtual time is the simulator's; target {req.target} runs in real time")
    if req.clock:
        data["target"]["sim"]["clock"] = req.clock
    if req.engine_image:
        data["target"]["kubernetes"]["engine"]["image"] = req.engine_image
    if req.namespace:
        data["target"]["kubernetes"]["namespace"] = req.namespace
    if req.gpu_hour_usd is not None:
        data["cost"]["gpu_hour_usd"] = req.gpu_hour_usd
    spec = parse_spec(data, f"preset {req.preset}")
    if profile is not None:
        spec = apply_profile(spec, profile)
    spec = select_configurations(spec, list(req.configurations) or None)
    return resolve_gpu_budget(spec, req.gpu_budget, "gpu_budget") if req.gpu_budget is not None else spec


def run_name(req: RunRequest, date: str) -> str:
    """Flow-run and results-folder name, e.g. pd-text-sim-2026-11-29."""
    clock = req.clock or load_spec(req.preset).target.sim.clock     # the preset's when the form leaves it empty
    where = "sim-virtual" if clock == "virtual" and req.target == "sim" else req.target
    return req.run_key or re.sub(r"[^A-Za-z0-9._-]", "-", f"{req.preset}-{where}-{date}")
