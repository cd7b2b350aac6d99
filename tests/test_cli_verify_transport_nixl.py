"""`epdbench verify-transport` on NIXL/UCX pod logs (tests/data/logs/nixl: genuine UCX 1.23 lines from the real NIXL
wheel, UCX 1.19 lines quoted from public issues)."""
import json
from pathlib import Path

import pytest

from epdbench.cli import main

LOGS = Path(__file__).parent / "data" / "logs" / "nixl"


@pytest.mark.parametrize("files,expect,extra,verdict,exit_code,reason", [
    (["tcp-forced-prefill", "tcp-forced-decode"], "tcp", [], "verified", 0, "used only TCP lanes"),
    (["rdma-ok-prefill", "rdma-ok-decode"], "rdma", [], "verified", 0,
     "used only RDMA lanes on mlx5_ib2:1, mlx5_ib6:1, mlx5_ib7:1"),
    (["legacy-ep-cfg-decode"], "tcp", [], "verified", 0, "used only TCP lanes"),
    (["ec-tcp-encode", "ec-tcp-prefill"], "tcp", ["--encoder-outputs"], "verified", 0,
     "encoder outputs moved (3 NIXL READs of encoder outputs completed)"),
    # RDMA asked, no HCA: UCX dropped rc and ud and chose tcp (genuine lines)
    (["rdma-asked-tcp-chosen-prefill", "rdma-asked-tcp-chosen-decode"], "rdma", [], "mismatch", 3,
     "expected rdma; 2 endpoints (rdma-asked-tcp-chosen-decode.log thread 18252 intra-node cfg#1; "
     "rdma-asked-tcp-chosen-prefill.log thread 18248 intra-node cfg#1): lanes rma_am(tcp/lo), "
     "amo_am(tcp/lo), am(tcp/lo), am(tcp/eth0), ka(tcp/lo) on TCP (UCX: rc, ud not available)"),
    (["tcp-forced-prefill", "tcp-forced-decode"], "rdma", [], "mismatch", 3, "on TCP"),
    (["rdma-ok-prefill", "rdma-tp-worker-tcp-lane-decode"], "rdma", [], "mismatch", 3,
     "expected rdma; rdma-tp-worker-tcp-lane-decode.log Worker_TP1 pid=3102205 inter-node cfg#3: lanes am(tcp/eth0), "
     "ka(tcp/eth0) on TCP"),
    (["rdma-ok-prefill", "rdma-failed-reads-decode"], "rdma", [], "mismatch", 3,
     "getXferStatus: backend 'UCX' returned error status NIXL_ERR_BACKEND"),
    (["rdma-text-in-prompt-decode"], "rdma", [], "mismatch", 3, "thread 18252 intra-node cfg#1"),
    (["ec-tcp-prefill"], "tcp", ["--encoder-outputs"], "no-evidence", 3, "completed NIXL READ of encoder outputs"),
])
def test_nixl_fixtures_are_classified(files, expect, extra, verdict, exit_code, reason, capsys):
    paths = [str(LOGS / f"{f}.log") for f in files]
    assert main(["verify-transport", *paths, "--expect", expect, *extra, "--json"]) == exit_code
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == verdict and out["connector"] == "nixl"
    assert any(reason in r for r in out["reasons"]), out["reasons"]


def test_text_output_names_every_worker_and_lane(capsys):
    assert main(["verify-transport", str(LOGS / "rdma-ok-prefill.log"), str(LOGS / "rdma-tp-worker-tcp-lane-decode.log"),
                 "--expect", "rdma"]) == 3
    text = capsys.readouterr().out
    assert text.startswith("mismatch: expected rdma; rdma-tp-worker-tcp-lane-decode.log Worker_TP1 pid=3102205")
    assert ("  rdma-tp-worker-tcp-lane-decode.log: UCX chose mixed (UCX 1.19.0, UCX_TLS asked rc,ud,cuda_copy,sm,self), "
            "24 successful transfers") in text
    assert ("    Worker_TP1 pid=3102205 inter-node cfg#3: rma(rc_mlx5/mlx5_ib6:1) amo(rc_mlx5/mlx5_ib6:1) "
            "am(rc_mlx5/mlx5_ib6:1) am(tcp/eth0) ka(tcp/eth0)") in text


def test_text_output_says_each_reason_once_on_its_own_line(capsys):
    """Both pods' endpoints share one lane set: one reason with its count, one line per reason under the verdict."""
    assert main(["verify-transport", str(LOGS / "tcp-forced-prefill.log"), str(LOGS / "tcp-forced-decode.log"),
                 "--expect", "rdma"]) == 3
    text = capsys.readouterr().out
    reasons = [line for line in text.splitlines() if line.startswith("mismatch: ")]
    assert reasons and len(reasons) == len(set(reasons))
    assert reasons[0].startswith("mismatch: expected rdma; 2 endpoints (tcp-forced-decode.log thread 18239 "
                                 "intra-node cfg#1; tcp-forced-prefill.log thread 18234 intra-node cfg#1): lanes ")
    assert sum(line.count("rma_am(tcp/lo), amo_am(tcp/lo)") for line in reasons) == 1


def test_mooncake_logs_still_read_as_mooncake_and_the_choice_can_be_forced(capsys):
    mooncake = Path(__file__).parent / "data" / "logs"
    assert main(["verify-transport", str(mooncake / "tcp-ok-prefill.log"), str(mooncake / "tcp-ok-decode.log"),
                 "--expect", "tcp", "--json"]) == 0
    assert "connector" not in json.loads(capsys.readouterr().out)
    assert main(["verify-transport", str(mooncake / "tcp-ok-prefill.log"), "--expect", "tcp", "--connector", "nixl",
                 "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["verdict"] == "no-evidence"


def test_encoder_outputs_over_mooncake_is_bad_input(capsys):
    assert main(["verify-transport", str(LOGS / "ec-tcp-encode.log"), "--expect", "tcp", "--encoder-outputs",
                 "--connector", "mooncake"]) == 2
    assert "encoder outputs move over NIXL" in capsys.readouterr().err
