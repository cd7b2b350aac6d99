"""Run one suite's load generator inside the cluster: apply the configuration's load generator ConfigMap and
the suite's Job (manifests.render.render_loadgen, validated first), wait until the Job completes or fails
(bounded), read its pod's log back through pods/log and parse it (tasks.load.loadgen_wire: incomplete output is
reported, never taken whole), then delete the Job and its pod. Everything else of the run is deleted by label
at teardown, as the deployment is."""
from __future__ import annotations

import time
from typing import Callable

from epdbench.manifests.render import render_loadgen, validate_manifests
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.tasks.k8s.api import PATIENCE_S, KubeApi, KubeApiError, patiently
from epdbench.tasks.load.loadgen_wire import LoadgenResult, parse_output


def job_state(job: dict) -> str | None:
    """"complete", "failed" or None (still running) from a Job's status."""
    status = job.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "Failed"):
            return "complete" if c["type"] == "Complete" else "failed"
    if status.get("succeeded"):
        return "complete"
    if status.get("failed"):
        return "failed"
    return None


def run_loadgen_job(api: KubeApi, spec: ExperimentSpec, config: ConfigurationSpec, run: str, suite: str,
                    spec_yaml: str, calibration: dict | None, version: str, timeout_s: float,
                    poll_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep, only: list[str] | None = None,
                    say: Callable[[str], None] = lambda line: None) -> LoadgenResult:
    """`only`: the `cell#tN` the Job measures (a resumed suite); None: all of them. `say` gets a line when the API
    server stops answering during the wait (the Job runs on in the cluster) and one when it answers again."""
    objects = render_loadgen(spec, config, run, spec_yaml, calibration)
    config_map = objects[0]
    job = next(o for o in objects[1:] if o["metadata"]["annotations"]["epdbench/suite"] == suite)
    if only is not None:
        job["spec"]["template"]["spec"]["containers"][0]["args"] += ["--only", ",".join(only)]
    validate_manifests([config_map, job], version)
    name = job["metadata"]["name"]

    def patient(call):
        """The call, asked again while the API server does not answer (it restarts; the Job runs on)."""
        return patiently(call, clock() + PATIENCE_S, clock, sleep)

    patient(lambda: api.apply(config_map))
    patient(lambda: api.apply(job))
    deadline = clock() + timeout_s
    state = None
    try:
        silent_since = None
        while state is None:
            try:
                state = job_state(api.get("Job", name))
                if silent_since is not None:
                    say(f"Job {name}: the API server answers again after {clock() - silent_since:.0f} s")
                    silent_since = None
            except KubeApiError as e:
                if not e.transient or clock() >= deadline:
                    raise
                if silent_since is None:
                    silent_since = clock()
                    say(f"Job {name}: the API server does not answer ({str(e)[:120]}); the Job runs on in the "
                        "cluster, asking again")
            if state is None:
                if clock() >= deadline:
                    break
                sleep(poll_s)
        pods = patient(lambda: api.list("Pod", f"job-name={name}"))
        if not pods:
            return LoadgenResult(problem=f"Job {name} has no pod ({state or 'still running'} after {timeout_s:.0f} s)")
        text = patient(lambda: api.pod_log(pods[0]["metadata"]["name"], "loadgen"))
        result = parse_output(text.splitlines())
        if not result.complete:
            result.problem += (f" (Job {name} still running after {timeout_s:.0f} s)" if state is None
                               else f" (Job {name} {state})")
        return result
    finally:
        try:
            patient(lambda: api.delete("Job", name))
        except KubeApiError:
            pass        # the teardown deletes it with everything labelled, and says so if it cannot
