"""Experiment spec: strict Pydantic models, one module per concern (node, topology, suites, targets),
gathered here with the experiment itself and loadable from YAML.

Every field carries a title and a description (a test checks it) so the same models
drive the CLI, the YAML presets and the Prefect UI form.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, model_validator

from epdbench.physics.costmodel import image_tokens
from epdbench.specs.gpu_share import gpu_shares
from epdbench.specs.real_shapes import real_shapes_problem
from epdbench.specs.field_names import did_you_mean
from epdbench.specs.base import KvTransport, RoleName, Strict, Topology, dump_yaml
from epdbench.specs.cost import CostSpec
from epdbench.specs.node import CPU_BLOCK_TOKENS, GPU_BLOCK_TOKENS, EngineSpec, HardwareSpec, ModelSpec, VisionSpec
from epdbench.specs.suites import (CellCounts, FixedSuite, ImageCell, MixedSuite, MultimodalSuite, RateSuite, Shape,
                                   Slo, StreamSpec, Suite, sends_images)
from epdbench.specs.targets import (EmptyDirModelCache, HostPathModelCache, KubeEngineSpec, KubeNodeSpec,
                                    KubeRouterSpec, KubernetesTargetSpec, LocalTargetSpec, PvcModelCache, SimFaults,
                                    SimTargetSpec, TargetSpec)
from epdbench.specs.topology import ConfigurationSpec, RoleSpec
from epdbench.specs.tracing import TracingSpec

__all__ = ["RateSuite", "Slo", "CellCounts", "ConfigurationSpec", "CostSpec", "EmptyDirModelCache", "EngineSpec", "ExperimentSpec",
           "FixedSuite", "HardwareSpec", "HostPathModelCache", "ImageCell", "KubeEngineSpec", "KubeNodeSpec",
           "KubeRouterSpec", "KubernetesTargetSpec", "KvTransport", "LocalTargetSpec", "MixedSuite", "ModelSpec",
           "MultimodalSuite", "PvcModelCache",
           "RoleName", "RoleSpec", "Shape", "SimFaults", "SimTargetSpec", "SpecError", "StreamSpec", "Strict", "Suite",
           "TargetSpec", "Topology", "TracingSpec", "TrackingSpec", "VisionSpec", "describe_validation_error", "load_spec",
           "parse_spec", "resolve_spec_path", "select_configurations", "spec_fingerprint", "spec_to_yaml"]

PRESET_DIR = Path(__file__).resolve().parent


class TrackingSpec(Strict):
    experiment: str = Field("epdbench", min_length=1, title="MLflow experiment",
                            description="Experiment the comparison is logged under.")
    tracking_uri: str | None = Field(None, title="Tracking URI",
                                     description="MLflow tracking URI; default a SQLite store under .epdbench/.")


class ExperimentSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,60}$", title="Spec name", description="e.g. smoke.")
    description: str = Field("", title="Description", description="What this spec compares.")
    seed: int = Field(0, ge=0, title="Seed", description="Seeds prompts and images; same seed, same requests.")
    trials: int = Field(1, ge=1, le=20, title="Trials", description="Repetitions of every cell.")
    cell_timeout_s: float | None = Field(None, ge=1, title="Cell timeout (s)",
                                         description="A cell (or mixed window) running longer fails its "
                                                     "configuration; the other configurations still run. "
                                                     "Empty: no limit.")
    configuration_timeout_s: float | None = Field(None, ge=1, title="Configuration timeout (s)",
                                                  description="Limit on all the suites of one configuration. "
                                                              "Empty: no limit.")
    max_failed_fraction: float = Field(0.0, ge=0, le=1, title="Tolerated failed requests",
                                       description="Share of a cell's measured requests that may fail before the "
                                                   "cell, and its configuration, count as degraded (re-run by "
                                                   "--resume). 0: any failed request degrades the cell.")
    request_timeout_s: float = Field(300, gt=0, le=3600, title="Request timeout (s)",
                                     description="A request slower than this is recorded as an error.")
    client_processes: int = Field(1, ge=1, le=64, title="Load generator processes",
                                  description="Processes sharing each cell's concurrency (one event loop each), "
                                              "for ingest beyond one core; stamps stay on one system-wide clock.")
    model: ModelSpec = Field(title="Model", description="Served model and its architecture figures.")
    hardware: HardwareSpec = Field(title="Hardware", description="The GPU node.")
    engine: EngineSpec = Field(default_factory=EngineSpec, title="Engine limits", description="vLLM limits.")
    configurations: list[ConfigurationSpec] = Field(min_length=1, title="Configurations",
                                                    description="Deployments to compare.")
    suites: list[Suite] = Field(min_length=1, title="Suites", description="Workloads every configuration runs.")
    target: TargetSpec = Field(default_factory=TargetSpec, title="Target", description="Where it runs.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, title="Tracking", description="MLflow settings.")
    tracing: TracingSpec = Field(default_factory=TracingSpec, title="Request tracing",
                                 description="Per-request stage timelines (OpenTelemetry spans).")
    cost: CostSpec = Field(default_factory=CostSpec, title="Cost",
                           description="The price of a GPU-hour, for cost per million output tokens.")

    @model_validator(mode="after")
    def _check(self) -> "ExperimentSpec":
        names = [c.name for c in self.configurations]
        if len(set(names)) != len(names):
            raise ValueError(f"configuration names must be unique: {names}")
        suites = [s.name for s in self.suites]
        if len(set(suites)) != len(suites):
            raise ValueError(f"suite names must be unique: {suites}")
        for i, c in enumerate(self.configurations):
            # a spec whose engines share one GPU on the local target keeps its node's one GPU on the simulator too,
            # which time-slices it between them in virtual time (sim.gpu) and gives each role a GPU on the HTTP clock
            if c.gpus > self.hardware.gpus_per_node and not self.target.local.gpu_share:
                raise ValueError(f"field 'configurations.{i}' ({c.name}) needs {c.gpus} GPUs but "
                                 f"'hardware.gpus_per_node' is {self.hardware.gpus_per_node}: "
                                 "lower replicas or tp, or use a bigger node")
            for j, r in enumerate(c.roles):
                if why := self.model.tp_problem(r.tp):
                    valid = ", ".join(map(str, self.model.valid_tps(self.hardware.gpus_per_node)))
                    raise ValueError(f"field 'configurations.{i}.roles.{j}.tp' ({c.name}, {r.role}): TP {r.tp} "
                                     f"cannot serve {self.model.name}: {why}; use TP {valid}")
        if self.engine.max_num_batched_tokens < self.engine.max_num_seqs:    # vLLM SchedulerConfig._verify_args
            raise ValueError(f"field 'engine.max_num_batched_tokens' ({self.engine.max_num_batched_tokens}) must be "
                             f"greater than or equal to 'engine.max_num_seqs' ({self.engine.max_num_seqs}), as vLLM "
                             "requires: raise the one or lower the other")
        for i, s in enumerate(self.suites):
            if sends_images(s) and self.model.vision is None:
                raise ValueError(f"field 'suites.{i}' ({s.name}) sends images but 'model.vision' is not set: "
                                 "use a multimodal model or drop the suite")
            for workload, prompt, output in self._longest_requests(s):
                if prompt + output > self.engine.max_model_len:
                    left = self.engine.max_model_len - prompt
                    cut = (f"cut their outputs to {left} tokens" if left > 0
                           else "refuse prompts that long")
                    raise ValueError(f"field 'suites.{i}' ({s.name}): workload {workload} asks for up to {prompt} "
                                     f"prompt and {output} output tokens, more than 'engine.max_model_len' "
                                     f"({self.engine.max_model_len}): vLLM would {cut}; raise max_model_len or "
                                     "shorten the workload")
        if self.target.kind == "kubernetes":
            self._check_kubernetes()
        if self.target.kind == "local":
            self._check_local()
        if self.virtual:
            self._check_virtual()
        return self

    def _check_virtual(self) -> None:
        sim = self.target.sim
        if sim.kv_engine != "emulated":
            raise ValueError("field 'target.sim.kv_engine' (mooncake) moves real bytes between processes; the "
                             "virtual clock runs none: use clock real, or kv_engine emulated")
        if sim.faults.kill_replica or sim.faults.skip_prefill_fraction:
            raise ValueError("field 'target.sim.faults' injects faults into simulator processes; the virtual "
                             "clock runs none: use clock real, or drop the faults")

    @property
    def virtual(self) -> bool:
        """Run on the simulator in virtual time (target.sim.clock virtual): no processes, no HTTP."""
        return self.target.kind == "sim" and self.target.sim.clock == "virtual"

    def _longest_requests(self, suite: Suite) -> list[tuple[str, int, int]]:
        """(workload, its longest prompt in tokens, its output tokens) for each workload of a suite: the prompt
        as specs.workload.build_requests aims it (a chat request's text plus its image's tokens and the chat
        template's)."""
        def prompt(text: int, image_px: int | None) -> int:
            if image_px is None:
                return text
            return text + self.model.chat_overhead_tokens + image_tokens(self.model, image_px, image_px)
        if isinstance(suite, (FixedSuite, RateSuite)):
            return [(s.workload, prompt(s.input_tokens, s.image_px), s.output_tokens) for s in suite.shapes]
        if isinstance(suite, MultimodalSuite):
            return [(c.workload, prompt(c.text_tokens, c.image_px), c.output_tokens) for c in suite.cells]
        return [(st.workload, prompt(st.input_tokens if st.input_tokens is not None else st.input_tokens_max,
                                     st.image_px), st.output_tokens) for st in suite.streams]

    def _check_kubernetes(self) -> None:
        for i, c in enumerate(self.configurations):
            if "rdma" in (c.kv_transport, c.ec_expected) and not self.target.kubernetes.node.rdma_resource:
                raise ValueError(f"field 'configurations.{i}' ({c.name}) moves KV or encoder outputs over RDMA but "
                                 "'target.kubernetes.node.rdma_resource' is not set: name the RDMA device "
                                 "plugin's resource, e.g. rdma/rdma_shared_device_a")

    def _check_local(self) -> None:
        """What real engines on one host can run (vLLM 0.32's CPU build and 0.26 on a GPU host tried; see docs)."""
        local = self.target.local
        device = local.device
        for i, c in enumerate(self.configurations):
            where = f"field 'configurations.{i}' ({c.name})"
            if c.topology == "epd" and device == "cpu":
                raise ValueError(f"{where}: EPD on the local target needs device cuda (vLLM's CPU build runs no "
                                 "vision model: its image processor needs a torchvision the CPU index does not "
                                 "have): use --target sim, or drop it with --configs")
            if c.topology == "epd" and c.ec_transport is not None:
                raise ValueError(f"{where}: on the local target the encoder outputs go through a shared folder "
                                 "(target.local.ec_shared_dir), not a network: leave ec_transport unset")
            if c.topology != "aggregated" and c.kv_connector == "mooncake" and device == "cpu":
                # its worker takes torch.accelerator.current_device_index() (vLLM 0.26 mooncake_connector.py:912)
                raise ValueError(f"{where}: MooncakeConnector does not start without an accelerator "
                                 "(target.local.device cpu): use kv_connector nixl, or device cuda on a GPU host")
            if c.kv_transport == "rdma" and device == "cpu":
                raise ValueError(f"{where}: KV over RDMA needs NICs the CPU build does not drive: use kv_transport "
                                 "tcp on target.local.device cpu")
            if local.gpu_share:
                if any(r.tp > 1 for r in c.roles):
                    raise ValueError(f"{where}: target.local.gpu_share puts every engine on GPU 0: tp must be 1")
                try:
                    gpu_shares(self, c)
                except ValueError as e:
                    raise ValueError(f"field 'target.local.gpu_share': {e}") from None
        if local.made_model == "tiny" and self.model.vision is not None:
            raise ValueError("field 'target.local.tiny_model': the tiny model is text-only but 'model.vision' is set; "
                             "drop model.vision")
        if local.made_model == "real-shapes" and (why := real_shapes_problem(self.model)):
            raise ValueError(f"field 'target.local.model_files' (real-shapes): {why}")

    @property
    def shares_one_gpu(self) -> bool:
        """Every engine of a configuration on GPU 0 (target.local.gpu_share)."""
        return self.target.kind == "local" and self.target.local.gpu_share

    def gpus_used(self, config: ConfigurationSpec) -> int:
        """GPUs a configuration runs on: one when its engines share GPU 0, else a GPU per role replica and TP rank
        (what per-GPU figures divide by)."""
        return 1 if self.shares_one_gpu else config.gpus

    @property
    def kv_block_tokens(self) -> int:
        """Tokens per KV cache block the engines use: the spec's, else vLLM's default on the target's device."""
        if self.engine.block_size:
            return self.engine.block_size
        on_cpu = self.target.kind == "local" and self.target.local.device == "cpu"
        return CPU_BLOCK_TOKENS if on_cpu else GPU_BLOCK_TOKENS

    @property
    def time_scale(self) -> float:
        """How many times slower than real time the target runs: a dilated simulator's factor, else 1."""
        return self.target.sim.time_scale if self.target.kind == "sim" and not self.virtual else 1.0

    def configuration(self, name: str) -> ConfigurationSpec:
        for c in self.configurations:
            if c.name == name:
                return c
        raise KeyError(name)


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the field and the fix."""


def describe_validation_error(err: ValidationError, source: str, model: type | None = None) -> str:
    """The first error in one line naming its field; an unknown field close to one of `model`'s gets its name."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden" and model is not None:
        msg += did_you_mean(model, first["loc"])
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    where = f"field '{loc}': " if loc else ""
    return f"{source}: {where}{msg}{more}"


def resolve_spec_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.is_file():          # a folder named like a preset (e.g. ./smoke) does not shadow it
        return p
    if p.is_dir() and not (PRESET_DIR / f"{name_or_path}.yaml").exists():
        raise SpecError(f"spec '{name_or_path}' is a directory: give a spec YAML file or a preset name")
    preset = PRESET_DIR / f"{name_or_path}.yaml"
    if preset.exists():
        return preset
    presets = ", ".join(sorted(x.stem for x in PRESET_DIR.glob("*.yaml")))
    raise SpecError(f"spec '{name_or_path}' not found: give a YAML path or a preset ({presets})")


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: where (line and column, from 1) and what."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = " ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML{where}: {what}"


def load_spec(name_or_path: str = "smoke") -> ExperimentSpec:
    path = resolve_spec_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: {yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level")
    return parse_spec(data, str(path))


def parse_spec(data: dict, source: str = "spec") -> ExperimentSpec:
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(describe_validation_error(e, source, ExperimentSpec)) from None


def select_configurations(spec: ExperimentSpec, names: list[str] | None) -> ExperimentSpec:
    if not names:
        return spec
    known = [c.name for c in spec.configurations]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SpecError(f"--configs: unknown configuration(s) {', '.join(unknown)}; "
                        f"this spec has {', '.join(known)}")
    chosen = [c for c in spec.configurations if c.name in names]
    return spec.model_copy(update={"configurations": chosen})


NOT_COMPARED = {"tracking", "tracing", "description", "cost"}   # where results are logged, which requests are
# traced (ingest within noise: benchmarks/loadgen/loadgen.py --tracing), prose, and the price a report puts on a
# GPU-hour


LOCAL_GPU_FIELDS = ("model_files", "gpu_share", "gpu_shares", "encode_vision_only", "router", "ec_shared_dir",
                    "start_together")
LAW_FIELDS = ("op_laws", "op_timings", "measured_compute_factor", "measured_hbm_factor", "measured_vision_factor")


def roofline_as_before(hardware: dict) -> dict:
    """A hardware section (as JSON) on the roofline laws with the measured laws' fields at their defaults loses
    those fields, in place: its physics is the one before them, and so is its fingerprint."""
    if hardware.get("op_laws") == "roofline" and hardware.get("op_timings") is None and all(
            hardware.get(f, HardwareSpec.model_fields[f].default) == HardwareSpec.model_fields[f].default
            for f in LAW_FIELDS[2:]):
        for field in LAW_FIELDS:
            hardware.pop(field, None)
    return hardware


def spec_fingerprint(spec: ExperimentSpec) -> str:
    """What makes two runs comparable: the resolved spec less where results are logged, its prose and the price of a
    GPU-hour (tracking, description, cost: a price changes no figure a run measures). Regression history matches on
    it, not only on the spec's name. The measured operator laws (hardware.op_laws, the default) gave every preset a
    new one: runs on the roofline laws before them are other physics; a spec on the roofline laws keeps the
    fingerprint it had."""
    data = spec.model_dump(mode="json", exclude=NOT_COMPARED)
    if data["target"]["sim"]["clock"] == "real":   # the default: fingerprints of runs before the clock stay equal
        del data["target"]["sim"]["clock"]
    if data["target"]["kind"] != "local":   # runs on the other targets keep the fingerprints they had before it
        del data["target"]["local"]
    else:                                   # the GPU lane's fields at their defaults: CPU runs keep theirs
        for field in LOCAL_GPU_FIELDS:
            if data["target"]["local"][field] == LocalTargetSpec.model_fields[field].get_default(
                    call_default_factory=True):
                del data["target"]["local"][field]
    kube = data["target"]["kubernetes"]
    if kube["dcgm_exporter"] == KubernetesTargetSpec.model_fields["dcgm_exporter"].default:   # as before the field
        del kube["dcgm_exporter"]
    if data["engine"]["block_size"] is None:   # vLLM's default block: fingerprints stay as before the field
        del data["engine"]["block_size"]
    if data["hardware"]["measured_vision_factor"] == 1.0:   # as measured: fingerprints stay as before the field
        del data["hardware"]["measured_vision_factor"]
    if data["hardware"]["request_render_ms"] == 0.0:   # not modelled: fingerprints stay as before the field
        del data["hardware"]["request_render_ms"]
    if data["hardware"]["vision_pass_ms"] == 0.0:      # the same
        del data["hardware"]["vision_pass_ms"]
    for suite in data["suites"]:   # no warm-up by concurrency: fingerprints stay as before the field
        if suite.get("n_warmup_by_concurrency") == {}:
            del suite["n_warmup_by_concurrency"]
    roofline_as_before(data["hardware"])
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def spec_changes(before: ExperimentSpec, after: ExperimentSpec, most: int = 4) -> list[str]:
    """What `after` changes of `before` in what spec_fingerprint covers, as "path: old → new", "path: added" or
    "path: removed" (lists of named items by name, of other containers by position; at most `most` entries, then how
    many more); empty when their fingerprints are equal."""
    changes: list[str] = []
    absent = object()

    def text(value) -> str:
        shown = json.dumps(value)
        return shown if len(shown) <= 40 else shown[:39] + "…"

    def by_name(value) -> dict | None:
        if isinstance(value, list) and all(isinstance(x, dict) and "name" in x for x in value):
            return {x["name"]: x for x in value}
        return None

    def walk(path: str, a, b) -> None:
        if a == b:
            return
        if isinstance(a, list) and isinstance(b, list) and by_name(a) is not None and by_name(b) is not None:
            a, b, path = by_name(a), by_name(b), path + "[{}]"
        elif (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
              and all(isinstance(x, (dict, list)) for x in a + b)):
            a, b, path = dict(enumerate(a)), dict(enumerate(b)), path + "[{}]"
        elif isinstance(a, dict) and isinstance(b, dict):
            path = f"{path}.{{}}" if path else "{}"
        elif b is absent or a is absent:
            changes.append(f"{path}: {'removed' if b is absent else 'added'}")
            return
        else:
            changes.append(f"{path}: {text(a)} → {text(b)}")
            return
        for key in list(a) + [k for k in b if k not in a]:
            walk(path.format(key), a.get(key, absent), b.get(key, absent))

    walk("", before.model_dump(mode="json", exclude=NOT_COMPARED), after.model_dump(mode="json", exclude=NOT_COMPARED))
    return changes[:most] + ([f"{len(changes) - most} more"] if len(changes) > most else [])


REACH_FIELDS = ("kubeconfig", "context", "namespace", "keep")   # how a run reaches its cluster, not what it measures


def resume_changes(stored: ExperimentSpec, spec: ExperimentSpec) -> list[str]:
    """What resuming a run whose folder holds `stored` (its spec.yaml) with `spec` would change of what the run
    measures (spec_changes): the remaining cells must be measured as the first attempt's were. How the cluster
    is reached (REACH_FIELDS of target.kubernetes) may differ."""
    reach = {field: getattr(spec.target.kubernetes, field) for field in REACH_FIELDS}
    kube = stored.target.kubernetes.model_copy(update=reach)
    return spec_changes(stored.model_copy(update={"target": stored.target.model_copy(update={"kubernetes": kube})}),
                        spec)


def spec_to_yaml(spec: ExperimentSpec) -> str:
    return dump_yaml(spec.model_dump(mode="json"))
