"""The Job state the in-cluster load generator's wait reads (pure). The Job itself runs against the real control
plane: tests/cluster/test_jobs_pool_cluster.py."""
from __future__ import annotations

import pytest

from epdbench.tasks.k8s.loadgen import job_state


@pytest.mark.parametrize("status,state", [({"active": 1}, None), ({"succeeded": 1}, "complete"),
                                          ({"conditions": [{"type": "Failed", "status": "True"}]}, "failed")])
def test_job_state(status, state):
    assert job_state({"status": status}) == state
