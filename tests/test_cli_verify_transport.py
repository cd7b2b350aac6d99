"""`epdbench verify-transport` on logs in the real formats of REFERENCE.md (one file per KV pod)."""
import json
from pathlib import Path

import pytest

from epdbench.cli import main

LOGS = Path(__file__).parent / "data" / "logs"


@pytest.mark.parametrize("files,expect,verdict,exit_code,reason", [
    (["rdma-ok-prefill", "rdma-ok-decode"], "rdma", "verified", 0, "installed RDMA on mlx5_ib1"),
    (["tcp-ok-prefill", "tcp-ok-decode"], "tcp", "verified", 0, "installed TCP"),
    (["tcp-hcas-present-forced-prefill", "tcp-ok-decode"], "tcp", "verified", 0, "installed TCP"),
    (["rdma-hcas-found-tcp-installed-prefill", "tcp-ok-decode"], "tcp", "verified", 0, "installed TCP"),
    (["tcp-ok-prefill", "tcp-ok-decode"], "rdma", "mismatch", 3, "installed TCP (0 HCAs found, MC_FORCE_TCP set)"),
    (["rdma-ok-prefill", "rdma-asked-tcp-installed-decode"], "rdma", "mismatch", 3,
     "expected rdma; rdma-asked-tcp-installed-decode.log thread 67953 installed TCP (0 HCAs found"),
    (["rdma-ok-prefill", "rdma-failed-slices-decode"], "rdma", "mismatch", 3, "failed_slices=2"),
    (["interleaved-tp-prefill", "rdma-ok-decode"], "rdma", "verified", 0, "mlx5_0"),
    (["protocol-claim-only", "protocol-claim-only"], "rdma", "no-evidence", 3, "not evidence"),
    (["garbage"], "tcp", "no-evidence", 3, "no Mooncake transport install line"),
    # each way a log could fool the verdict, with the pod and the worker named
    (["rdma-hcas-found-tcp-installed-prefill", "rdma-ok-decode"], "rdma", "mismatch", 3,
     "rdma-hcas-found-tcp-installed-prefill.log thread 714 installed TCP (2 HCAs found, no MC_FORCE_TCP line)"),
    (["rdma-tp-worker-fallback-prefill", "rdma-ok-decode"], "rdma", "mismatch", 3,
     "rdma-tp-worker-fallback-prefill.log Worker_TP1 pid=802 installed TCP"),
    (["rdma-nothing-moved-prefill", "rdma-ok-decode"], "rdma", "no-evidence", 3,
     "rdma-nothing-moved-prefill.log thread 714: installed rdma but none of its throughput windows"),
    (["rdma-text-in-prompt-prefill", "rdma-ok-decode"], "rdma", "mismatch", 3,
     "rdma-text-in-prompt-prefill.log thread 714 installed TCP"),
    (["rdma-text-only-in-prompt-prefill"], "rdma", "no-evidence", 3, "no Mooncake transport install line"),
])
def test_fixture_kinds_are_classified(files, expect, verdict, exit_code, reason, capsys):
    paths = [str(LOGS / f"{f}.log") for f in files]
    assert main(["verify-transport", *paths, "--expect", expect, "--json"]) == exit_code
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == verdict
    assert any(reason in r for r in out["reasons"]), out["reasons"]


def test_text_output_and_throughput_formats(capsys):
    assert main(["verify-transport", str(LOGS / "rdma-ok-prefill.log"), str(LOGS / "tcp-ok-prefill.log"),
                 "--expect", "rdma"]) == 3
    text = capsys.readouterr().out
    assert text.startswith("mismatch:")
    assert "rdma-ok-prefill.log: installed rdma, HCAs 2" in text
    assert "    thread 1844453: installed rdma, HCAs 2, windows (MB/s) 1390.73, 2210.02" in text
    assert text.splitlines()[0].count("\n") == 0
    main(["verify-transport", str(LOGS / "rdma-ok-prefill.log"), "--expect", "rdma", "--json"])
    pod = json.loads(capsys.readouterr().out)["pods"]["rdma-ok-prefill.log"]
    assert pod["throughput_mb_s"] == [1390.73, 2210.02]          # new format, μs and us
    main(["verify-transport", str(LOGS / "tcp-ok-prefill.log"), "--expect", "tcp", "--json"])
    assert json.loads(capsys.readouterr().out)["throughput_mb_s_max"] == 113.07   # old format


def test_simulator_logs_are_never_verified(tmp_path, capsys):
    from epdbench.sim.logfmt import glog_line
    log = tmp_path / "sim-prefill.log"
    log.write_text("\n".join([glog_line("I", 1, "transfer_engine.cpp", 1, "MC_FORCE_TCP is set, using TCP transport only"),
                              glog_line("I", 1, "transfer_engine.cpp", 1, "[Metrics] Transfer Engine Stats (over last 1s): "
                                        "Throughput: 900.00 MB/s")]) + "\n")
    assert main(["verify-transport", str(log), "--expect", "tcp", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["verdict"] == "emulated"


def test_missing_file_is_bad_input(capsys):
    assert main(["verify-transport", "/nonexistent.log", "--expect", "tcp"]) == 2
    assert "no such log file" in capsys.readouterr().err
