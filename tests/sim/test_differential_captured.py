"""The protocol differential in the default lane: the simulator against a real vLLM engine's captured answers,
/metrics and log (tests/data/differential/, written by tests/test_differential_local.py), through the same pure
comparison and the same list of known differences."""
from __future__ import annotations

import yaml

from epdbench.analysis.differential import check_known, compare_exchanges, known_from
from epdbench.analysis.probes import probes
from tests.differential_client import KNOWN, read_capture, run_exchange


def test_the_simulator_answers_the_probes_as_the_captured_real_engine_did_but_for_the_listed_differences(tmp_path):
    real = read_capture()
    assert list(real["answers"]) == [p.name for p in probes("m", 1)], "recapture: the probes changed"
    sim = run_exchange("sim", tmp_path)
    verdict = check_known(compare_exchanges(real, sim), known_from(yaml.safe_load(KNOWN.read_text())))
    assert verdict.ok, "\n".join(verdict.lines())
