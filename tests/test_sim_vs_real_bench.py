"""benchmarks/simulator/sim_vs_real.py: the simulator set beside a truth table — here one the simulator made with moved
engine constants (tests/truth_tables.py) — is off by what the moves make before the profile calibrate --engine-steps
fits, and matches it after, at the median, the 90th percentile and the worst cell; a table of several configurations is
also judged as a choice between them; bad input is one line and exit 2."""
from __future__ import annotations

import re

import pytest

from epdbench.cli import main as cli
from epdbench.specs.models import load_spec
from tests.benchmark_scripts import load_benchmark
from tests.truth_tables import synthetic_truth


def script():
    return load_benchmark("simulator/sim_vs_real")


def overall(printed: str, block: int = 0) -> list[str]:
    """The figures of the `overall` line of the medians (block 0) or of the p90 and worst cell (block 1)."""
    medians, tails = [x for x in printed.splitlines() if x.strip().startswith("overall ")]
    return (medians, tails)[block].split()[1:]


def test_before_and_after_the_fitted_profile(tmp_path, capsys):
    table = synthetic_truth(tmp_path / "truth.csv")
    profile = tmp_path / "engine.yaml"
    assert cli(["calibrate", "--engine-steps", str(table), "--out", str(profile)]) == 0
    capsys.readouterr()
    assert script().main(["--truth", str(table), "--profile", str(profile)]) == 0
    printed = capsys.readouterr().out
    cells, error_before, ratio_before, error_after, ratio_after = overall(printed)
    assert cells == str(15 * 8)
    assert float(error_before.rstrip("%")) > 10 and float(ratio_before) < 0.9      # the hidden engine is slower
    assert float(error_after.rstrip("%")) < 0.1 and float(ratio_after) == pytest.approx(1.0, abs=1e-3)
    cells, p90_before, p90_after, *worst = overall(printed, 1)
    assert cells == str(15 * 8) and float(p90_before.rstrip("%")) > float(error_before.rstrip("%"))
    assert float(p90_after.rstrip("%")) < 0.5
    assert re.fullmatch(r"\S+ \S+ c=\d+ .+ \(\d\.\d{3}\) \S+ \S+ c=\d+ .+ \(\d\.\d{3}\)", " ".join(worst))
    lines = printed.splitlines()
    first = lines.index(next(x for x in lines if "sim / real before → after the profile per cell" in x))
    assert lines[first + 2].split()[:3] == ["text", "1024/128", "c=1"]           # the spec's order
    assert re.search(r"image 1792px\+400/128 c=4 +\d\.\d{3}→1\.000", printed)
    assert "15 cells simulated twice in" in printed and "warning" not in printed


def test_other_prompts_are_named(tmp_path, capsys):
    import pandas as pd

    table = synthetic_truth(tmp_path / "truth.csv")
    frame = pd.read_csv(table)
    frame.loc[frame["workload"] == "4096/128", "prompt_tokens_mean"] = 4000
    frame.to_csv(table, index=False)
    assert script().main(["--truth", str(table)]) == 0
    printed = capsys.readouterr().out
    assert "warning: prompts differ, text 4096/128 c=1: sim 4096, real 4000 tokens" in printed
    assert len(overall(printed)) == 3
    assert "configurations" not in printed                           # one configuration: nothing to rank


def test_several_configurations_are_named_and_judged_as_a_choice(tmp_path, capsys):
    import pandas as pd

    spec = load_spec("gpu-qwen25vl")
    table = synthetic_truth(tmp_path / "truth.csv", spec, hidden={})    # the spec's own constants: sim = real
    assert script().main(["--truth", str(table), "--spec", "gpu-qwen25vl"]) == 0
    printed = capsys.readouterr().out
    configs = [c.name for c in spec.configurations]
    assert f"the {len(configs)} configurations ({', '.join(configs)}) per cell and metric" in printed
    assert re.search(r"\n  epd text 1024/128 c=1 +1\.000 ", printed)               # each cell names its own
    assert re.search(r"winner agreement: (\d+) of \1 judgements \(100\.0%\)", printed)
    assert re.search(r"pairwise-order agreement: (\d+) of \1 judgements \(100\.0%\); [1-9]\d* pairs a tie",
                     printed)                              # pd-nixl-tcp and epd serve text alike: a tie
    assert "winner disagreements: none" in printed and "pairwise disagreements: none" in printed
    frame = pd.read_csv(table)                             # epd's real TTFT at 1k, c=1 now half aggregated's
    text = (frame["suite"] == "text") & (frame["concurrency"] == 1)
    aggregated = frame.loc[text & (frame["config"] == "aggregated"), "ttft_p50_ms"].item()
    frame.loc[text & (frame["config"] == "epd"), "ttft_p50_ms"] = aggregated / 2
    frame.to_csv(table, index=False)
    assert script().main(["--truth", str(table), "--spec", "gpu-qwen25vl"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"winner disagreements \(1\):\n    text 1024/128 c=1 TTFT p50: real epd 100\.0% ahead of "
                     r"aggregated; sim aggregated first, \d+\.\d% ahead of epd", printed)
    # epd against aggregated and against pd-nixl-tcp, which the simulator serves text alike (pd-mooncake-tcp, a
    # little slower in the simulator, is behind epd on both sides)
    assert re.search(r"pairwise disagreements \(2\):\n.*\n    text 1024/128 c=1 TTFT p50: real epd \d+\.\d% ahead of "
                     r"pd-nixl-tcp; sim pd-nixl-tcp and epd even\n", printed)


@pytest.mark.parametrize("argv, expected", [
    (["--truth", "{dir}/none.csv"], "--truth {dir}/none.csv: no such file"),
    (["--truth", "{table}", "--profile", "{dir}/none.yaml"], "--profile {dir}/none.yaml: no such file"),
    (["--truth", "{table}", "--tool", "vllm-bench"], "no row of tool 'vllm-bench': the table has epdbench"),
    (["--truth", "{table}", "--spec", "smoke"], "suite text not in spec smoke (it has fixed, mm-context, mixed)"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, expected):
    table = tmp_path / "truth.csv"
    table.write_text("gpu,tool,config,suite,workload,concurrency,input_tokens,image_px,output_tokens\n"
                     "NVIDIA H100 80GB HBM3,epdbench,aggregated,text,1024/128,1,1024,0,128\n")
    fill = {"dir": str(tmp_path), "table": str(table)}
    assert script().main([a.format(**fill) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and expected.format(**fill) in err, err
