"""analysis.kv_transfers: the KV link's rate from the connector's own `KV Transfer metrics` windows, read in vLLM's
real format (lines as vLLM 0.26's NixlConnector wrote them on an H100: benchmarks/data/h100-2026-12-06/)."""
import gzip
from pathlib import Path

import pytest

from epdbench.analysis.kv_transfers import MIN_LONE, Window, link_constant, link_rate, windows_of
from epdbench.analysis.ucx import MIB

LINE = ("(APIServer pid=1332) INFO 12-06 08:55:{s:02d} [metrics.py:103] KV Transfer metrics: Num successful "
        "transfers={n}, Avg xfer time (ms)={ms}, P90 xfer time (ms)={ms}, Avg post time (ms)=1.193, P90 post time "
        "(ms)=1.193, Avg MB per transfer={mb}, Throughput (MB/s)=415.518, Avg number of descriptors=28.0\n")
LANE = Path(__file__).resolve().parents[2] / "benchmarks/data/h100-2026-12-06/lane-pd-nixl-tcp/decode-0.log.gz"


def line(n=1, ms=138.983, mb=57.75, s=24):
    return LINE.format(n=n, ms=ms, mb=mb, s=s)


def test_a_window_is_read_whole_in_vllms_format():
    w = windows_of([line()], "decode-0")
    assert w.untimed == 0 and len(w.timed) == 1
    one = w.timed[0]
    assert (one.pod, one.transfers, one.avg_ms, one.descriptors, one.emulated) == ("decode-0", 1, 138.983, 28.0, False)
    assert one.avg_bytes == pytest.approx(57.75 * MIB)


def test_only_whole_lines_of_the_metrics_logger_count():
    real = line()
    text = real.split("] ", 1)[1]
    others = [
        f"(APIServer pid=1) INFO 12-06 08:55:24 [serving.py:88] Received request: prompt 'KV Transfer metrics: {text}'",
        f"(APIServer pid=1) INFO 12-06 08:55:24 [api_server.py:103] {text}",     # another source file
        "garbage " + real,                                                        # not a vLLM line from its start
        real.replace("transfers=1,", "transfers=0,"),                             # an idle window
    ]
    assert windows_of(others, "decode-0").timed == []


def test_a_window_without_time_or_size_is_counted_apart():
    # MooncakeConnector's line in vLLM 0.32 has counts and sizes but no transfer time
    mooncake = ("(APIServer pid=1) INFO 10-01 12:00:00 [metrics.py:103] KV Transfer metrics: Num successful "
                "transfers=3, Avg MB per transfer=28.0, Num failed transfers=0, Num failed recvs=0, Num KV expired "
                "reqs=0\n")
    w = windows_of([mooncake, line()], "prefill-0")
    assert w.untimed == 1 and len(w.timed) == 1


def rate(*windows, setup=0.0):
    return link_rate(windows, lambda w: setup)


def test_lone_windows_give_the_median_rate_and_shared_ones_are_left_out():
    lone = [Window("d", 1, ms, 50e6, 28, False) for ms in (100, 110, 125, 100, 200)]   # 500, 455, 400, 500, 250 MB/s
    r = rate(*lone, Window("d", 4, 450, 50e6, 28, False))
    assert r.bytes_per_s == pytest.approx(50e6 / 0.110) and r.overlapped == 1 and len(r.rates) == 5
    assert r.low <= r.bytes_per_s <= r.high and r.low == pytest.approx(50e6 / 0.2)
    assert r.mean_bytes == pytest.approx(50e6)


def test_the_setup_is_taken_off_each_transfer_before_its_rate():
    lone = [Window("d", 1, 101, 50e6, 28, False)] * MIN_LONE
    assert rate(*lone, setup=0.001).bytes_per_s == pytest.approx(50e6 / 0.100)
    # a window no longer than the setup measures no rate
    r = rate(*lone, Window("d", 1, 0.5, 1e3, 1, False), setup=0.001)
    assert r.too_short == 1 and len(r.rates) == MIN_LONE


def test_too_few_lone_windows_give_no_rate():
    r = rate(*[Window("d", 1, 100, 50e6, 28, False)] * (MIN_LONE - 1), Window("d", 2, 100, 50e6, 28, False))
    assert r.bytes_per_s is None and r.low is None and len(r.rates) == MIN_LONE - 1 and r.overlapped == 1


def test_a_rate_sets_the_transports_constant():
    assert link_constant("tcp", 461e6, 400) == ("tcp_gb_s", pytest.approx(0.461))
    name, value = link_constant("rdma", 36.5e9, 400, 1)          # 400 Gbit/s = 50 GB/s
    assert name == "rdma_efficiency" and value == pytest.approx(0.73)
    assert link_constant("rdma", 36.5e9, 400, 2)[1] == pytest.approx(0.365)


def test_the_h100_lanes_decode_log():
    """The PD lane on an H100 (UCX held to TCP on one host): 27 windows, 20 of one transfer, about 0.46 GB/s."""
    with gzip.open(LANE, "rt") as fh:
        w = windows_of(fh, "decode-0")
    assert w.untimed == 0 and len(w.timed) == 27
    r = link_rate(w.timed, lambda _: 22e-6)
    assert len(r.rates) == 20 and r.overlapped == 7
    assert 0.42e9 < r.low < r.bytes_per_s < r.high < 0.52e9


def test_a_share_per_window_pools_rates_per_nic():
    """Two senders, one with two NICs moving twice as fast: per NIC their windows agree."""
    one = [Window("a/decode-0", 1, 100, 50e6, 28, False)] * 3     # 500 MB/s on one NIC
    two = [Window("b/decode-0", 1, 50, 50e6, 28, False)] * 3      # 1 GB/s on two
    nics = {"a/decode-0": 1, "b/decode-0": 2}
    r = link_rate(one + two, lambda w: 0.0, lambda w: nics[w.pod])
    assert r.rates == pytest.approx([500e6] * 6) and r.bytes_per_s == pytest.approx(500e6)
