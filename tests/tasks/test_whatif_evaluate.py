"""tasks/whatif.evaluate: one rate of a variant in virtual time, and its early stop once the rate surely fails."""
import gc
import warnings

import pytest

from epdbench.analysis.goodput import wilson
from epdbench.analysis.whatif import variants
from epdbench.specs.models import Slo, parse_spec
from epdbench.tasks import whatif
from epdbench.tasks.vrun import prompt_calibration


@pytest.fixture(scope="module")
def setup(tiny_spec):
    data = tiny_spec.model_dump(mode="json")
    data["configurations"] = [c for c in data["configurations"] if c["name"] == "aggregated"]
    data["suites"] = [{"kind": "rate", "name": "capacity", "shapes": [{"input_tokens": 2048, "output_tokens": 16}],
                       "rates": [2], "n_measured": 24, "n_warmup": 1, "slo": {"ttft_ms": 400, "attainment": 0.9}}]
    spec = parse_spec(data)
    return spec, variants(spec, [1])[0], spec.suites[0], prompt_calibration(spec)


def full(monkeypatch, *args):
    """The same evaluation without the early stop."""
    with monkeypatch.context() as m:
        m.setattr(whatif.MissCounter, "__call__", lambda self, rec: False)
        return whatif.evaluate(*args)


def test_a_rate_far_above_capacity_stops_once_it_surely_fails_with_the_same_verdict(setup, monkeypatch, caplog):
    spec, variant, suite, calibration = setup
    args = (spec, variant, suite, 0, 64.0, calibration, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no coroutine never awaited, no loop left open
        early = whatif.evaluate(*args)
        gc.collect()
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text    # no task destroyed pending
    whole = full(monkeypatch, *args)
    assert early.stopped_early and not whole.stopped_early
    assert early.requests == whole.requests == 128
    assert early.surely_fails and whole.surely_fails and not early.sustained
    assert whole.met <= early.met                    # the early point's met is an upper bound
    assert wilson(early.met, early.requests)[1] < suite.slo.attainment
    assert early.itl_p99_ms is None


def test_a_rate_that_holds_runs_to_the_end(setup, monkeypatch):
    spec, variant, suite, calibration = setup
    args = (spec, variant, suite, 0, 0.5, calibration, 2.0)
    point = whatif.evaluate(*args)
    assert not point.stopped_early and point == full(monkeypatch, *args)
    assert point.met == point.requests == 24


def test_the_miss_counter_stops_at_the_first_count_that_decides_the_rate():
    slo = Slo(ttft_ms=100, attainment=0.9)
    counter = whatif.MissCounter(slo, 48)
    assert wilson(48 - counter.enough, 48)[1] < 0.9 <= wilson(48 - counter.enough + 1, 48)[1]
    assert counter.every == 16
    # one request cannot surely fail a target of 0.5 (0 of 1 has a Wilson interval up to 0.79): never stops
    assert whatif.MissCounter(Slo(ttft_ms=100, attainment=0.5), 1).enough == 2
