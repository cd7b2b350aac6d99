"""A process of the deployment dying while a cell runs stops the cell at once (flows/suite.py): the requests that
finished are kept, every other one is recorded failed naming the dead process, the attempt is failed in the
ledger and DeploymentDied names it — against a simulator replica that SIGKILLs itself on its 5th request, with the
real load generator, over loopback."""
from __future__ import annotations

import time

import pandas as pd
import pytest
import yaml

from epdbench.flows.suite import DeploymentDied, run_suite
from epdbench.specs.models import load_spec
from epdbench.tasks.rundir.resume import read_ledger
from epdbench.tasks.sim import target as sim_target

pytestmark = pytest.mark.timeout(180)
N_MEASURED = 200        # at concurrency 2, far longer than the cell lasts once the replica is dead


def test_a_replica_dying_mid_cell_stops_the_cell_and_names_it_in_every_unfinished_request(tmp_path, tiny_spec_path):
    data = yaml.safe_load(tiny_spec_path.read_text())
    data["configurations"] = [c for c in data["configurations"] if c["name"] == "aggregated"]
    data["suites"] = [{"kind": "fixed", "name": "text", "concurrencies": [2], "n_warmup": 1,
                       "n_measured": N_MEASURED, "shapes": [{"input_tokens": 128, "output_tokens": 256}]}]
    data.setdefault("target", {})["sim"] = {"router": "builtin",
                                            "faults": {"kill_replica": "server-0", "kill_after_requests": 5}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = load_spec(str(path))
    dep = sim_target.start(spec, spec.configuration("aggregated"), path, tmp_path / "sim")
    t0 = time.monotonic()
    try:
        with pytest.raises(DeploymentDied) as died:
            run_suite.fn(dep.endpoint, spec, "text", "aggregated", "run-1", str(tmp_path / "records.parquet"), {},
                         health=dep.health)
    finally:
        sim_target.stop(dep)
    assert "server-0 (pid" in str(died.value) and "killed by SIGKILL" in str(died.value)
    records = pd.read_parquet(tmp_path / "records.parquet")
    measured = records[records.phase == "measured"]
    assert len(measured) == N_MEASURED and records["request_id"].is_unique      # each planned request once
    assert measured["index"].tolist() == sorted(measured["index"])
    unfinished = measured[measured["error"].fillna("").str.startswith("not completed: server-0 (pid")]
    assert len(unfinished) > N_MEASURED / 2, measured["error"].value_counts()   # stopped, not run to its end
    assert (~unfinished["ok"]).all()
    assert [e["status"] for e in read_ledger(tmp_path, "aggregated").values()] == ["failed"]
    print(f"cell stopped {time.monotonic() - t0:.1f} s after it began, {len(unfinished)} requests unfinished")
