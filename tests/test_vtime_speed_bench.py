"""benchmarks/simulator/vtime_speed.py: the figures it prints carry their noise, and its A/B verdict counts a difference
only when every process of one version was faster than every process of the other."""
import math

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("simulator/vtime_speed")


def test_a_version_is_faster_only_when_all_its_processes_beat_all_of_the_others(bench):
    assert bench.verdict([0.20, 0.21, 0.22, 0.25], [0.10, 0.11, 0.12, 0.19]).startswith("faster beyond noise: ×2.00")
    assert bench.verdict([0.10, 0.11, 0.12, 0.19], [0.20, 0.21, 0.22, 0.25]).startswith("slower beyond noise: ×0.50")
    # one slow process of the old version overlaps the new one's range: the best-process ratio is no finding
    assert bench.verdict([0.10, 0.20, 0.21, 0.22], [0.11, 0.12, 0.13, 0.14]).startswith("within noise: ×0.91")
    assert "by chance: 2.9%" in bench.verdict([2.0] * 4, [1.0] * 4)


def test_the_chance_of_a_split_by_luck_is_the_exact_rank_test(bench):
    # of the C(2n, n) equally likely orders of 2n processes, 2 put one version's n all first
    assert bench.chance(4, 4) == pytest.approx(2 / 70)
    assert bench.chance(5, 5) == pytest.approx(2 / 252)
    assert bench.chance(2, 3) == pytest.approx(2 / math.comb(5, 2))


def test_the_records_digest_ignores_their_order_and_sees_any_change(bench):
    rows = [{"request_id": "a", "ttft_ms": 1.5}, {"request_id": "b", "ttft_ms": 2.0}]
    assert bench.digest(rows) == bench.digest(rows[::-1])
    assert bench.digest(rows) != bench.digest([rows[0], {**rows[1], "ttft_ms": 2.0000001}])


def test_a_measurement_reports_modelled_and_host_time_and_the_same_records_every_time(bench, tiny_spec_path):
    first = bench.measure(str(tiny_spec_path), rounds=2, quiet=True)
    again = bench.measure(str(tiny_spec_path), rounds=1, quiet=True)
    assert len(first["host_s"]) == 2 and all(h > 0 for h in first["host_s"])
    assert first["modelled_s"] > 0 and first["modelled_s"] == again["modelled_s"]
    assert first["records"] == again["records"]     # the virtual core is deterministic for the spec's seed


def test_an_ab_run_with_too_few_processes_is_refused(bench, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["vtime_speed.py", "smoke", "--against", "HEAD", "--processes", "3"])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 2
    assert "at least 4 processes" in capsys.readouterr().err
