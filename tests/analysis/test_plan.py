"""analysis/plan.py and `epdbench plan`: every cell per configuration, before anything runs."""
import json

from epdbench.cli import main
from epdbench.specs.models import load_spec
from epdbench.analysis.plan import STARTUP_S, plan, total_seconds

KEYS = {"config", "suite", "workload", "concurrency", "rate", "load", "stream", "n_warmup", "n_measured",
        "prompt_set_hash", "est_seconds"}


def test_plan_lists_every_cell_of_every_configuration():
    spec = load_spec("pd-text")
    rows = plan(spec)
    assert len(rows) == 3 * (16 + 2 + 5)        # fixed, mixed streams, capacity rates
    capacity = [r for r in rows if r["suite"] == "capacity"]
    # an open-loop cell lasts about its arrivals' span: 48 requests at 0.5 req/s take over 96 s
    assert min(r["est_seconds"] for r in capacity if r["workload"].endswith("@0.5/s")) > 96
    assert all(set(r) == KEYS for r in rows)
    fixed16 = [r for r in rows if r["suite"] == "fixed" and r["concurrency"] == 16]
    assert {r["n_measured"] for r in fixed16} == {64} and {r["n_warmup"] for r in fixed16} == {4}
    # matched: the same prompt set for every configuration
    by_cell = {}
    for r in rows:
        by_cell.setdefault((r["suite"], r["workload"], r["concurrency"], r["stream"]), set()).add(r["prompt_set_hash"])
    assert all(len(h) == 1 for h in by_cell.values())


def test_estimates_follow_the_cost_model():
    rows = {(r["config"], r["workload"], r["concurrency"]): r["est_seconds"] for r in plan(load_spec("pd-text"))}
    assert rows[("pd-tcp", "256/1024", 1)] > rows[("pd-tcp", "512/256", 1)]        # 4× the output tokens
    assert rows[("pd-tcp", "8192/128", 16)] > rows[("pd-rdma", "8192/128", 16)]     # TCP handoff slower
    spec = load_spec("smoke")
    assert 30 < total_seconds(spec, plan(spec)) < 600


def test_a_reused_image_is_estimated_as_cached():
    rows = {(r["config"], r["suite"], r["concurrency"]): r["est_seconds"] for r in plan(load_spec("epd-reuse"))}
    for config in ("aggregated", "pd-tcp", "epd", "epd-rdma"):
        for c in (4, 8):
            assert rows[(config, "mm-reuse", c)] < rows[(config, "mm-unique", c)], (config, c)


def test_plan_json_cli(capsys):
    assert main(["plan", "--spec", "smoke", "--configs", "pd-tcp", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["config"] == "pd-tcp" and set(r) == KEYS for r in rows)
    assert main(["plan", "--configs", "nope"]) == 2


def test_a_dilated_simulator_is_estimated_that_much_slower():
    from epdbench.specs.models import parse_spec
    data = load_spec("smoke").model_dump(mode="json")
    data["target"]["sim"]["clock"] = "real"          # simulator processes: virtual time has no dilation
    real = parse_spec(data)
    data["target"]["sim"]["time_scale"] = 3
    plain, dilated = plan(real), plan(parse_spec(data))
    assert all(abs(d["est_seconds"] - 3 * p["est_seconds"]) <= 0.2 for d, p in zip(dilated, plain))   # rounding
    startup = STARTUP_S * len(real.configurations)
    measured = total_seconds(real, plain) - startup
    assert abs(total_seconds(real, dilated) - startup - 3 * measured) < 2.0


def test_plan_says_a_virtual_spec_runs_in_virtual_time_and_what_the_real_clock_would_take(capsys):
    assert main(["plan"]) == 0                      # the quick start: smoke, in virtual time
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("28 cells × 3 trial(s) in virtual time: seconds of simulation") and "--clock real" in last
    assert main(["plan", "--spec", "pd-text"]) == 0
    assert "on the simulator (cost model; real hardware differs)" in capsys.readouterr().out


def test_rate_cells_are_planned_by_their_rate_and_in_flight_cap(capsys):
    spec = load_spec("pd-text")
    rows = plan(spec)
    cap = next(s.max_in_flight for s in spec.suites if s.name == "capacity")
    capacity = [r for r in rows if r["suite"] == "capacity" and r["config"] == "aggregated"]
    assert [r["load"] for r in capacity] == [f"{r['rate']:g} req/s (≤{cap} in flight)" for r in capacity]
    assert {r["load"] for r in rows if r["suite"] == "fixed"} == {f"concurrency {r['concurrency']}"
                                                                  for r in rows if r["suite"] == "fixed"}
    assert main(["plan", "--spec", "pd-text", "--configs", "aggregated"]) == 0
    text = capsys.readouterr().out
    assert f"4 req/s (≤{cap} in flight)" in text and f"concurrency {cap}" not in text
    assert "@4/s" not in text             # the rate is said once, in the load column


def test_the_plan_says_what_its_columns_mean(capsys):
    assert main(["plan", "--spec", "smoke", "--configs", "pd-tcp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    legend = lines[lines.index("columns:") + 1:-1]
    explained = {line.split("  ")[1].strip() for line in legend}
    assert {"stream", "warm", "meas", "prompts", "est s"} <= explained and {"stream", "warm", "meas"} < set(header)
    assert lines[-1].startswith(f"{len(lines) - 3 - len(legend)} cells × ")   # header, rows, "columns:", legend
