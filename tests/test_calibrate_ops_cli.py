"""`epdbench calibrate --ops CSV --out PROFILE`: a gpu_ops CSV of one's own GPU becomes a profile that `compare
--profile` and `whatif --profile` run on (the measured laws derived from its timings); a bad CSV is one line and
exit 2."""
from __future__ import annotations

import csv
import io

import pytest
import yaml

from epdbench.cli import main
from epdbench.cli.common import load_compare_spec
from epdbench.cli.parser import build_parser
from epdbench.physics.costmodel import CostModel
from epdbench.physics.gpu_ops import read_ops_csv
from epdbench.physics.measured import describe
from epdbench.physics.oplaws import SOURCE_CSV, digest
from epdbench.specs.models import load_spec
from epdbench.specs.profile import load_profile
from tests.test_whatif_cli import small_spec


def one_line_error(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err


def slower_gpu_csv(tmp_path, factor: float = 2.0):
    """The H200 CSV as if measured on a GPU `factor` times slower at everything: another GPU's timings."""
    rows = list(csv.DictReader(io.StringIO(SOURCE_CSV.read_text(encoding="utf-8"))))
    for r in rows:
        r["gpu"] = "NVIDIA L40S"
        for col in ("time_ms", "time_min_ms", "time_max_ms"):
            r[col] = repr(float(r[col]) * factor)
    path = tmp_path / "l40s.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_a_gpu_ops_csv_becomes_a_profile_that_compare_and_whatif_run_on(tmp_path, tiny_spec_path, capsys):
    ops, out = slower_gpu_csv(tmp_path), tmp_path / "mine.yaml"
    assert main(["calibrate", "--ops", str(ops), "--out", str(out), "--spec", str(tiny_spec_path)]) == 0
    printed = capsys.readouterr().out
    assert f"Operator timings of NVIDIA L40S (driver 580.159.04, torch 2.11.0+cu130, 2026-12-04) from {ops}: " \
           f"{len(read_ops_csv(ops))} rows" in printed
    assert "  Qwen/Qwen3-32B: GEMM, decode attention, decode step, prefill attention (measured laws)" in printed
    assert f"wrote {out}: use it with epdbench compare --profile {out} or epdbench whatif --profile {out}" in printed
    profile = load_profile(out)
    timings = profile["op_timings"]
    assert (profile["op_laws"], profile["hardware"], timings["gpu"]) == ("measured", {}, "NVIDIA L40S")
    assert timings["sha256"] == digest(timings["csv"]) and (timings["bf16_tflops"], timings["hbm_tb_s"]) == (989, 3.35)

    args = build_parser().parse_args(["compare", "--spec", str(tiny_spec_path), "--profile", str(out)])
    spec, _ = load_compare_spec(args)
    plain = load_spec(str(tiny_spec_path))
    mine, h200 = CostModel(spec.model, spec.hardware), CostModel(plain.model, plain.hardware)
    assert describe(spec.model, spec.hardware) == f"measured on NVIDIA L40S ({ops}), as measured"
    # measured twice as slow as the H200 and taken as the spec's own GPU: slower than the H200's laws on the
    # H100's bandwidth (1.43 times the H200's decode)
    assert mine.decode_step_seconds(8, 8 * 2048) > 1.3 * h200.decode_step_seconds(8, 8 * 2048)
    assert mine.encode_seconds(4096) > 1.9 * h200.encode_seconds(4096)

    assert main(["whatif", "--spec", str(small_spec(tiny_spec_path, tmp_path)), "--profile", str(out),
                 "--configs", "aggregated", "--replicas", "1", "--window", "2", "--refine", "1", "--workers", "1",
                 "--out", str(tmp_path / "whatif")]) == 0
    text = capsys.readouterr().out
    assert f"profile {out} (operator timings measured on NVIDIA L40S ({ops}, " in text


def test_without_a_spec_the_timings_are_taken_as_the_profiled_specs_own_gpus(tmp_path, capsys):
    out = tmp_path / "h200.yaml"
    assert main(["calibrate", "--ops", str(SOURCE_CSV), "--out", str(out)]) == 0
    assert "no --spec: the timings are taken as made on the GPU of whatever spec" in capsys.readouterr().out
    profile = load_profile(out)
    assert (profile["spec"], profile["gpu"], profile["op_timings"]["hbm_tb_s"]) == (None, None, None)
    args = build_parser().parse_args(["compare", "--spec", "pd-text", "--profile", str(out)])
    spec, _ = load_compare_spec(args)
    assert describe(spec.model, spec.hardware).endswith(", as measured")    # no H200 → H100 scaling


def rows_of(tmp_path, keep):
    text = SOURCE_CSV.read_text(encoding="utf-8").splitlines()
    path = tmp_path / "part.csv"
    path.write_text("\n".join([text[0]] + [line for line in text[1:] if keep(line)]) + "\n")
    return path


def not_a_gpu_ops_csv(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("gpu,op\nH200,gemm.qkv\n")
    return path


@pytest.mark.parametrize("make, flags, message", [
    (lambda p: p / "none.csv", [], "none.csv: cannot be read (FileNotFoundError): give a gpu_ops CSV"),
    (not_a_gpu_ops_csv, [], "bad.csv, header: missing driver"),
    (lambda p: rows_of(p, lambda line: ",gemm." in line), [],
     "no model has rows of every law (GEMM, prefill attention, decode attention, decode step); "),
    (lambda p: rows_of(p, lambda line: "Qwen3-32B" in line), ["--spec", "epd-multimodal"],
     "--spec: its model Qwen/Qwen2.5-VL-7B-Instruct is not measured whole in "),
    (lambda p: p / "x.csv", ["--from", "results/run"], "--ops and --from: give one"),
])
def test_a_bad_csv_or_flags_are_one_line_and_exit_2(tmp_path, capsys, make, flags, message):
    err = one_line_error(capsys, ["calibrate", "--ops", str(make(tmp_path)), "--out", str(tmp_path / "p.yaml"),
                                  *flags])
    assert message in err and not (tmp_path / "p.yaml").exists()


def test_two_gpus_in_one_csv_and_no_source_at_all_are_refused(tmp_path, capsys):
    text = SOURCE_CSV.read_text(encoding="utf-8")
    mixed = tmp_path / "mixed.csv"
    mixed.write_text(text + text.splitlines()[-1].replace("NVIDIA H200", "NVIDIA H100") + "\n")
    err = one_line_error(capsys, ["calibrate", "--ops", str(mixed), "--out", str(tmp_path / "p.yaml")])
    assert "rows of 2 GPUs (NVIDIA H100, NVIDIA H200): one GPU's timings per profile" in err
    err = one_line_error(capsys, ["calibrate", "--out", str(tmp_path / "p.yaml")])
    assert "--from: give the run to fit" in err and "--ops" in err


def test_a_profile_whose_timings_were_edited_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "h200.yaml"
    assert main(["calibrate", "--ops", str(SOURCE_CSV), "--out", str(out)]) == 0
    capsys.readouterr()
    data = yaml.safe_load(out.read_text())
    data["op_timings"]["csv"] = data["op_timings"]["csv"].replace(",0.027613,", ",0.027612,")
    out.write_text(yaml.safe_dump(data))
    err = one_line_error(capsys, ["whatif", "--spec", "pd-text", "--profile", str(out)])
    assert "op_timings" in err and "sha256 is not the digest of csv" in err
