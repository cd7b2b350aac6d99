"""The protocol differential against a real engine: the same probes (analysis/differential.py) sent to one real vLLM
CPU engine and to one simulator replica of cpu-tiny's aggregated configuration; every difference must be listed,
with its reason, in tests/data/differential/known_differences.yaml, and every listed one must still occur. About a
minute on 2 cores (the engine's start). EPDBENCH_CAPTURE_DIFFERENTIAL=1 writes the real engine's answers, /metrics
and log over the probes as the default lane's fixtures (tests/data/differential/)."""
from __future__ import annotations

import os

import pytest
import yaml

from epdbench.analysis.differential import check_known, compare_exchanges, known_from
from tests.differential_client import KNOWN, run_exchange, write_capture
from tests.test_e2e_local import engine_python

pytestmark = [pytest.mark.realengine, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def exchanges(tmp_path_factory):
    python = engine_python()
    where = tmp_path_factory.mktemp("differential")
    real = run_exchange("local", where / "real", python)
    sim = run_exchange("sim", where / "sim")
    print(f"real engine: started in {real['start_seconds']} s, probes in {real['seconds']} s")
    if os.environ.get("EPDBENCH_CAPTURE_DIFFERENTIAL") == "1":
        write_capture(real)
    return real, sim


def test_every_difference_from_a_real_engine_is_listed_with_its_reason_and_every_listed_one_occurs(exchanges):
    real, sim = exchanges
    verdict = check_known(compare_exchanges(real, sim), known_from(yaml.safe_load(KNOWN.read_text())))
    assert verdict.ok, "\n".join(verdict.lines())


def test_the_real_engine_answered_every_probe_and_logged_the_request_lines_the_parsers_anchor_on(exchanges):
    real, _ = exchanges
    assert real["answers"]["completion"]["status"] == 200 and real["answers"]["bad-unknown-model"]["status"] == 404
    assert any("Received request cmpl-diff-completion-0" in line for line in real["log"])
    assert "vllm:prompt_tokens_total" in real["metrics"]
