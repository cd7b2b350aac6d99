"""`epdbench whatif`: variants served in virtual time at searched rates, the capacity table printed and written
with its plots; bad input answered in one line (exit 2)."""
import json
import re

import pandas as pd
import pytest
import yaml

from epdbench.cli import main
from epdbench.specs.models import load_spec


def small_spec(tiny_spec_path, tmp_path, suites=True):
    spec = yaml.safe_load(tiny_spec_path.read_text())
    spec["name"] = "tiny-whatif"
    spec["configurations"] = [c for c in spec["configurations"] if c["name"] in ("aggregated", "pd-tcp")]
    spec["suites"] = ([{"kind": "rate", "name": "capacity", "shapes": [{"input_tokens": 2048, "output_tokens": 16}],
                        "rates": [2, 16], "n_measured": 12, "n_warmup": 1,
                        "slo": {"ttft_ms": 400, "attainment": 0.9}}] if suites else spec["suites"][:1])
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_whatif_prints_the_capacity_table_and_writes_tables_and_plots(tiny_spec_path, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["whatif", "--spec", str(small_spec(tiny_spec_path, tmp_path)), "--replicas", "1,2", "--window", "2",
                 "--refine", "1", "--workers", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    variants = pd.read_csv(out / "variants.csv")
    # aggregated: 1 or 2 servers; PD: prefill and decode 1 or 2 each — every one on a TP1 GPU
    assert sorted(variants["gpus"]) == [1, 2, 2, 3, 3, 4]
    best = pd.read_csv(out / "capacity.csv")
    assert list(best["configuration"].sort_values()) == ["aggregated", "pd-tcp"]
    for _, r in best.iterrows():
        assert r["goodput_req_s_per_gpu"] == pytest.approx(r["goodput_req_s"] / r["gpus"])
        assert r["goodput_req_s_per_gpu"] == variants[variants["configuration"] == r["configuration"]][
            "goodput_req_s_per_gpu"].max()
        assert re.search(rf"^ *{re.escape(r['configuration'])} +{re.escape(r['roles'])} +{r['gpus']} ", text, re.M)
    points = pd.read_csv(out / "points.csv")
    assert set(points["rate"]) >= {2.0} and (points["requests"] >= 12).all()
    # every figure with its noise: each rate's verdict, each capacity's range, ties between configurations
    assert points["uncertain"].dtype == bool
    assert ((points["attainment_low"] < points["target"]) & (points["target"] <= points["attainment_high"])
            <= points["uncertain"]).all()
    for _, r in variants.iterrows():
        mine = points[points["variant"] == r["variant"]].sort_values("rate")
        surely = mine[~mine["uncertain"]]
        if pd.notna(r["fails_surely_req_s"]):
            assert r["fails_surely_req_s"] == surely[~surely["sustained"]]["rate"].min()
        if pd.notna(r["holds_surely_req_s"]):
            assert r["holds_surely_req_s"] <= r["goodput_req_s"]
            assert mine[mine["rate"] <= r["holds_surely_req_s"]]["sustained"].all()
    assert "noise range" in text and "tie_with" in best.columns
    assert "\nnoise range: from the highest rate surely held to the lowest surely failed; surely: " in text
    assert "within noise" not in text          # the notes say it in words: too close to call, tied, may do as well
    assert (out / "whatif-goodput-per-gpu.png").stat().st_size > 1000
    assert (out / "whatif-capacity-attainment-vs-rate.png").exists()
    assert "not a measurement" in text and "6 variants" in text
    # what the tables are, for whoever reads the folder later: modelled, from which spec, options and error bar
    about = json.loads((out / "whatif.json").read_text())
    assert about["what"] == "modelled by the virtual-time simulator, not measured" and about["spec"] == "tiny-whatif"
    assert about["options"]["replicas"] == "1,2" and about["options"]["window_s"] == 2
    assert sorted(about["variants"]) == sorted(variants["variant"]) and about["profile"] is None
    assert about["model_error"].startswith("uncalibrated") and f"Model error: {about['model_error']}" in text
    assert load_spec(str(out / "spec.yaml")).name == "tiny-whatif"


@pytest.mark.parametrize("args, message", [
    (["--replicas", "0,1"], "--replicas 0,1: give comma-separated whole numbers of at least 1"),
    (["--transports", "tcp,ib"], "--transports tcp,ib: choose from tcp, rdma"),
    (["--max-gpus", "0"], "--max-gpus 0: between 1 and the node's 8 GPUs"),
    # a TP group over two nodes would all-reduce over the network, not the NVLink the model charges
    (["--max-gpus", "16"], "--max-gpus 16: between 1 and the node's 8 GPUs (hardware.gpus_per_node): the simulator "
                           "models one node"),
    (["--workers", "0"], "--workers: at least 1"),
    # vLLM refuses TP 3 for a model of 28 attention heads: no capacity is planned for a deployment that cannot start
    (["--tp", "1,3"], "--tp 1,3: TP 3 cannot serve Qwen/Qwen2.5-VL-7B-Instruct: vLLM needs it to divide the model's "
                      "28 attention heads; use TP 1, 2, 4"),
    (["--replicas", "1,9"],
     "--replicas 9: no variant with it fits on 8 GPUs (the node, hardware.gpus_per_node; drop it)"),
    (["--tp", "4", "--max-gpus", "3"],
     "--tp 4: no variant with it fits on 3 GPUs (--max-gpus; drop it or raise --max-gpus)"),
])
def test_bad_flags_are_one_line(tiny_spec_path, tmp_path, capsys, args, message):
    assert main(["whatif", "--spec", str(small_spec(tiny_spec_path, tmp_path)), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_tp_whose_engine_vllm_would_not_start_is_refused_in_vllms_words(capsys):
    assert main(["whatif", "--spec", "pd-text", "--tp", "1,2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tp 1,2: TP 1 cannot serve Qwen/Qwen3-32B: To serve at least one request with the "
                          "models's max seq len (32768), (8.00 GiB KV cache is needed")
    assert err.rstrip().endswith("when initializing the engine; use TP 2, 4, 8")


def test_combinations_over_the_gpus_are_counted_in_a_line(tiny_spec_path, tmp_path, capsys):
    assert main(["whatif", "--spec", str(small_spec(tiny_spec_path, tmp_path)), "--replicas", "1,2", "--max-gpus",
                 "3", "--configs", "pd-tcp", "--window", "2", "--refine", "1", "--workers", "1",
                 "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "3 variants of 1 configurations" in text          # prefill and decode 1+1, 1+2, 2+1 on TP1 GPUs
    assert ("  1 other combination of the replica counts and TP sizes left out: it needs 4 GPUs, over the 3 a "
            "variant may use\n") in text


def test_a_profiles_error_bar_says_which_variants_it_was_not_measured_on(tiny_spec_path, tmp_path, capsys):
    """A profile fitted to the spec's own deployments: the other variants' capacities extrapolate from it."""
    from tests.specs.test_profile import a_profile
    from epdbench.specs.profile import cell_fingerprints, profile_to_yaml

    path = small_spec(tiny_spec_path, tmp_path)
    spec = load_spec(str(path))
    profile = a_profile(gpu=spec.hardware.gpu, model=spec.model.name, cells_fitted=cell_fingerprints(spec),
                        op_laws=spec.hardware.op_laws)
    (tmp_path / "p.yaml").write_text(profile_to_yaml(profile))
    assert main(["whatif", "--spec", str(path), "--profile", str(tmp_path / "p.yaml"), "--configs", "aggregated",
                 "--replicas", "1,2", "--window", "2", "--refine", "1", "--workers", "1",
                 "--out", str(tmp_path / "out")]) == 0
    own = spec.configuration("aggregated").role("server").replicas
    text = capsys.readouterr().out
    assert ("Model error: its predictions' measured error on cells it was not fitted to (median |predicted/observed "
            "− 1|): ttft_p50_ms 4.0%; for 1 of this spec's 2 configuration-suite pairs (aggregated-s"
            f"{3 - own}x1 in capacity) no error was measured: their seed, suite, deployment or node differ from "
            "the run's;") in text


def test_a_spec_without_an_slo_suite_has_nothing_to_plan(tiny_spec_path, tmp_path, capsys):
    assert main(["whatif", "--spec", str(small_spec(tiny_spec_path, tmp_path, suites=False))]) == 2
    assert "no open-loop suite with an slo" in capsys.readouterr().err


def test_a_profile_replaces_the_constants_and_says_where_it_came_from(tiny_spec_path, tmp_path, capsys):
    from tests.specs.test_profile import a_profile
    from epdbench.specs.profile import profile_to_yaml

    spec = small_spec(tiny_spec_path, tmp_path)
    slow = a_profile()
    slow["hardware"] = {"compute_efficiency": 0.1}          # a fifth of the preset's: prefill far slower
    path = tmp_path / "profile.yaml"
    path.write_text(profile_to_yaml(slow))
    args = ["whatif", "--spec", str(spec), "--replicas", "1", "--window", "2", "--refine", "1", "--workers", "1"]
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert main([*args, "--profile", str(path), "--out", str(tmp_path / "profiled")]) == 0
    text = capsys.readouterr().out
    assert f"profile {path} (fitted to a run of spec {slow['spec']}" in text and "compute_efficiency 0.1" in text
    assert "Model error: uncalibrated: the spec's hardware constants, no measured error bar" in text   # plain
    assert "Model error: its predictions' measured error on cells it was not fitted to" in text       # profiled
    assert "the profile does not say which GPU and model it was fitted on" in text
    about = json.loads((tmp_path / "profiled" / "whatif.json").read_text())
    assert about["profile"] == str(path) and about["profile_contents"]["hardware"] == {"compute_efficiency": 0.1}
    assert f"Model error: {about['model_error']}" in text
    assert load_spec(str(tmp_path / "profiled" / "spec.yaml")).hardware.compute_efficiency == 0.1
    path.write_text(profile_to_yaml({**slow, "gpu": "A100-SXM4-40GB"}))              # fitted on another GPU
    assert main([*args, "--profile", str(path), "--out", str(tmp_path / "elsewhere")]) == 0
    text = capsys.readouterr().out
    gpu = yaml.safe_load(spec.read_text())["hardware"]["gpu"]
    assert f"compute_efficiency 0.1) — fitted on another GPU A100-SXM4-40GB (this spec: {gpu})" in text
    assert ("Model error: no measured error bar: the profile was fitted to a run on GPU A100-SXM4-40GB "
            f"(this spec: {gpu}), so its error on cells it was not fitted to (ttft_p50_ms 4.0%) was measured there, "
            "not for this spec") in text
    plain = pd.read_csv(tmp_path / "plain" / "capacity.csv").set_index("configuration")["goodput_req_s"]
    profiled = pd.read_csv(tmp_path / "profiled" / "capacity.csv").set_index("configuration")["goodput_req_s"]
    assert (profiled.fillna(0) < plain.fillna(0)).all()


def test_epd_capacity_for_multimodal_traffic_varies_the_encode_replicas_too(tiny_spec_path, tmp_path, capsys):
    """A rate suite whose shape carries an image plans EPD: every role's replicas vary, encode's included, and the
    capacity is found for the image shape (its requests' images: tests/specs/test_workload.py)."""
    spec = yaml.safe_load(tiny_spec_path.read_text())
    spec["configurations"] = [c for c in spec["configurations"] if c["name"] == "epd"]
    spec["hardware"]["gpus_per_node"] = 4
    spec["suites"] = [{"kind": "rate", "name": "capacity", "rates": [2, 16], "n_measured": 12, "n_warmup": 1,
                       "shapes": [{"image_px": 560, "input_tokens": 200, "output_tokens": 16}],
                       "slo": {"ttft_ms": 400, "attainment": 0.9}}]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    code = main(["whatif", "--spec", str(path), "--replicas", "1,2", "--window", "2", "--refine", "1",
                 "--workers", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    variants = pd.read_csv(out / "variants.csv")
    # encode, prefill and decode 1 or 2 each within 4 GPUs: 1-1-1 and the three with one role doubled
    assert sorted(variants["roles"]) == sorted(f"encode {e}×TP1 + prefill {p}×TP1 + decode {d}×TP1"
                                                for e, p, d in [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)])
    assert (variants["shape"] == "560px+200/16").all() and "capacity 560px+200/16" in text
    points = pd.read_csv(out / "points.csv")
    assert (points["requests"] >= 12).all() and points["met"].sum() > 0


def test_an_itl_p99_bound_no_rate_keeps_leaves_no_capacity_and_says_so(tiny_spec_path, tmp_path, capsys):
    spec = yaml.safe_load(small_spec(tiny_spec_path, tmp_path).read_text())
    spec["configurations"] = spec["configurations"][:1]
    spec["suites"][0]["slo"] = {"ttft_ms": 400, "itl_p99_ms": 0.5, "attainment": 0.9}   # below one decode step
    path = tmp_path / "itl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    assert main(["whatif", "--spec", str(path), "--replicas", "1", "--window", "2", "--refine", "1",
                 "--workers", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ITL p99 over all their tokens ≤ 0.5 ms" in text
    points = pd.read_csv(out / "points.csv")
    assert (points["itl_p99_ms"] > 0.5).all() and not points["sustained"].any() and (points["attainment"] > 0).all()
    assert "fails at the lowest rate tried (0.125 req/s)" in pd.read_csv(out / "capacity.csv")["note"].iloc[0]
    assert sorted(points["rate"]) == [2 / 2 ** k for k in range(4, -1, -1)]       # halved 4 times below 2


@pytest.mark.faults   # workers started and stopped in a subprocess: in the faults lane for time
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_an_interrupted_whatif_keeps_what_finished_with_one_line_and_nothing_left(tiny_spec_path, tmp_path, how):
    """SIGTERM to the command, or Ctrl-C to its whole process group (as a terminal sends it): exit 130, one line,
    the variants that finished written, the ones queued never started, no worker left running."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.processes import marked_processes

    mark = os.urandom(6).hex()
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "epdbench.cli", "whatif", "--spec",
                             str(small_spec(tiny_spec_path, tmp_path)), "--replicas", "1,2,3,4", "--window", "30",
                             "--workers", "2", "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "EPDBENCH_TEST_MARK": mark})
    seen = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen.append(line)
            if line.startswith("  [2/") or not line:
                break
        assert any(line.startswith("  [2/20]") for line in seen), "".join(seen)
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    finished = sum(1 for line in seen + rest.splitlines() if re.match(r" *\[\d+/20\]", line))
    assert lines[0].startswith("interrupted: every started process was stopped; "
                               f"the {finished} of 20 variants that finished are in {out}/")
    assert 2 <= finished < 20
    variants = pd.read_csv(out / "variants.csv")
    assert len(variants) == finished and not (out / "capacity.csv").exists()
    assert len(json.loads((out / "whatif.json").read_text())["variants"]) == 20      # what was planned
    assert set(pd.read_csv(out / "points.csv")["variant"]) == set(variants["variant"])
    time.sleep(0.5)
    assert not marked_processes(mark), "a worker outlived the command"
