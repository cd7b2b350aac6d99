"""A replica's counters, their Prometheus text under vLLM's metric names, and the periodic
Mooncake transfer-engine and "KV Transfer metrics" log windows."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from epdbench.sim import logfmt
from epdbench.sim.lag import LAG_BUCKETS_S, Lag

if TYPE_CHECKING:
    from epdbench.sim.replica import Replica


# vllm:request_success_total carries every finish reason from the start (vLLM 0.32 v1/metrics/loggers.py)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
# The engine core's per-request histograms (same file), exposed as their count and sum
REQUEST_HISTOGRAMS = ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
                      "time_to_first_token_seconds", "request_time_per_output_token_seconds")


@dataclass
class Counters:
    request_success: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prompt_by_source: dict[str, int] = field(
        default_factory=lambda: {"local_compute": 0, "local_cache_hit": 0, "external_kv_transfer": 0})
    mm_cache_queries: int = 0
    mm_cache_hits: int = 0
    kv_bytes: int = 0
    kv_transfers: int = 0
    kv_failed_transfers: int = 0
    kv_failed_recvs: int = 0
    kv_xfer_seconds: float = 0.0
    ec_bytes: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0

    def admit(self, prompt_tokens: int, computed: int, cached: int) -> None:
        """Count an admitted request's prompt tokens by where their KV comes from: `computed` tokens are
        already there (`cached` of them from the local prefix cache, the rest pulled), the others computed."""
        self.prompt_tokens += prompt_tokens
        self.prompt_by_source["local_compute"] += prompt_tokens - computed
        self.prompt_by_source["local_cache_hit"] += cached
        self.prompt_by_source["external_kv_transfer"] += computed - cached

    # the engine core's request histograms (vllm/v1/metrics/loggers.py), as (count, sum of seconds)
    request_times: dict[str, list[float]] = field(default_factory=lambda: {k: [0, 0.0] for k in REQUEST_HISTOGRAMS})

    def finish(self, reason: str, generated: int) -> None:
        self.request_success[reason] = self.request_success.get(reason, 0) + 1
        self.generation_tokens += generated

    def time_request(self, seq, time_scale: float = 1.0) -> None:
        """A finished request's times as vLLM's engine core histograms them: queued (arrival to scheduled), prefill
        (scheduled to first token), decode (first to last token), time to first token (from arrival) and per output
        token after the first; in modelled seconds. A time the request never reached is not observed."""
        got = {"request_queue_time_seconds": (seq.arrived, seq.scheduled_at),
               "request_prefill_time_seconds": (seq.scheduled_at, seq.first_token_at),
               "request_decode_time_seconds": (seq.first_token_at, seq.last_token_at),
               "time_to_first_token_seconds": (seq.arrived, seq.first_token_at)}
        for name, (start, end) in got.items():
            if start is not None and end is not None:
                self._observe(name, (end - start) / time_scale)
        start, end = got["request_decode_time_seconds"]
        if start is not None and end is not None and seq.generated > 1:
            self._observe("request_time_per_output_token_seconds", (end - start) / time_scale / (seq.generated - 1))

    def _observe(self, name: str, seconds: float) -> None:
        self.request_times[name][0] += 1
        self.request_times[name][1] += max(0.0, seconds)


@dataclass
class TransferWindow:
    """KV moved since the last metrics window: what Mooncake's MC_TE_METRIC line (sending side) or NixlConnector's
    `KV Transfer metrics` (reading side) reports."""
    n_bytes: int = 0
    count: int = 0
    lat_ms: list[float] = field(default_factory=list)
    descriptors: int = 0

    def record(self, n_bytes: int, latency_ms: float, descriptors: int = 1) -> None:
        self.n_bytes += n_bytes
        self.count += 1
        self.lat_ms.append(latency_ms)
        self.descriptors += descriptors


def prometheus_text(replica: Replica) -> str:
    c = replica.counters
    lbl = f'engine="0",model_name="{replica.spec.model.name}"'
    lines = ["# HELP epdbench_sim_info Emulated engine (no GPU). 1 means this is the epdbench simulator.",
             "# TYPE epdbench_sim_info gauge",
             f'epdbench_sim_info{{{lbl},role="{replica.role}",transport="{replica.transport}"}} 1']

    def counter(name, value, extra=""):
        # vLLM's exposition (prometheus_client in multiprocess mode) names a counter's TYPE line by its _total sample
        if f"# TYPE vllm:{name}_total counter" not in lines:
            lines.append(f"# TYPE vllm:{name}_total counter")
        lines.append(f"vllm:{name}_total{{{lbl}{extra}}} {value}")

    def histogram(name, count, total):      # a KV connector's per-transfer histogram: its count and sum
        lines.append(f"# TYPE vllm:{name} histogram")
        lines.append(f"vllm:{name}_count{{{lbl}}} {count}")
        lines.append(f"vllm:{name}_sum{{{lbl}}} {total}")

    for reason in FINISHED_REASONS + tuple(sorted(set(c.request_success) - set(FINISHED_REASONS))):
        counter("request_success", c.request_success.get(reason, 0), f',finished_reason="{reason}"')
    counter("prompt_tokens", c.prompt_tokens)
    counter("generation_tokens", c.generation_tokens)
    for src, n in c.prompt_by_source.items():
        counter("prompt_tokens_by_source", n, f',source="{src}"')
    counter("prefix_cache_queries", c.prefix_queries)
    counter("prefix_cache_hits", c.prefix_hits)
    counter("mm_cache_queries", c.mm_cache_queries)
    counter("mm_cache_hits", c.mm_cache_hits)
    for name in REQUEST_HISTOGRAMS:
        histogram(name, c.request_times[name][0], f"{c.request_times[name][1]:.6f}")
    engine = replica.engine
    counter("num_preemptions", engine.stats.preemptions)   # vllm/v1/metrics/loggers.py: "vllm:num_preemptions"
    lines += ["# TYPE vllm:num_requests_running gauge",
              f"vllm:num_requests_running{{{lbl}}} {engine.num_running}",
              "# TYPE vllm:num_requests_waiting gauge",
              f"vllm:num_requests_waiting{{{lbl}}} {engine.num_waiting}",
              "# TYPE vllm:kv_cache_usage_perc gauge",
              f"vllm:kv_cache_usage_perc{{{lbl}}} {engine.used_blocks() / max(1, engine.kv_blocks):.6f}"]
    lines += lag_histogram("epdbench_sim_step_lag_seconds", replica.engine.lag, lbl,
                           "How late each simulated engine step ended against its modelled end (host load).")
    lines += lag_histogram("epdbench_sim_emit_lag_seconds", replica.emit_lag, lbl,
                           "How late each streamed token was written against its step's modelled end (host load).")
    if replica.moves_kv and replica.kv.nixl:
        # NixlConnector's (nixl/stats.py): histograms of the decode's READs, failures as counters
        mine = replica.role == "decode"
        histogram("nixl_xfer_time_seconds", c.kv_transfers if mine else 0, c.kv_xfer_seconds if mine else 0)
        histogram("nixl_bytes_transferred", c.kv_transfers if mine else 0, c.kv_bytes if mine else 0)
        counter("nixl_num_failed_transfers", c.kv_failed_recvs if mine else 0)
    elif replica.moves_kv:
        # MooncakeConnector's (vLLM 0.33 mooncake/stats.py): histograms per transfer, failures as counters
        histogram("mooncake_xfer_time_seconds", c.kv_transfers, f"{c.kv_xfer_seconds:.6f}")
        histogram("mooncake_bytes_transferred", c.kv_transfers, c.kv_bytes)
        counter("mooncake_num_failed_transfers", c.kv_failed_transfers)
        counter("mooncake_num_failed_recvs", c.kv_failed_recvs)
    return "\n".join(lines) + "\n"


def lag_histogram(name: str, lag: Lag, lbl: str, help_text: str) -> list[str]:
    """Emulation lag (the simulator's own noise, modelled seconds) as a Prometheus histogram and a max gauge."""
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    out += [f'{name}_bucket{{{lbl},le="{edge:g}"}} {n}' for edge, n in zip(LAG_BUCKETS_S, lag.buckets)]
    out += [f'{name}_bucket{{{lbl},le="+Inf"}} {lag.count}', f"{name}_count{{{lbl}}} {lag.count}",
            f"{name}_sum{{{lbl}}} {lag.sum_s:.6f}"]
    gauge = name.replace("_seconds", "_max_seconds")
    return out + [f"# TYPE {gauge} gauge", f"{gauge}{{{lbl}}} {lag.max_s:.6f}"]


async def lag_log(replica: Replica, interval_s: float) -> None:
    """Every interval in which tokens were streamed, one engine log line with the window's emulation lag
    (steps and streamed tokens: count and mean, and the max since start), so a log reader sees it too."""
    last = (0, 0.0, 0, 0.0)
    while True:
        await asyncio.sleep(interval_s)
        s, t = replica.engine.lag, replica.emit_lag
        now = (s.count, s.sum_s, t.count, t.sum_s)
        if now[2] == last[2]:
            continue
        ds, dt = now[0] - last[0], now[2] - last[2]
        replica.engine_log(
            f"Emulation lag (last {interval_s:g}s, modelled time, time_scale={replica.time_scale:g}): "
            f"steps={ds} mean={1e3 * (now[1] - last[1]) / max(ds, 1):.3f} ms max={1e3 * s.max_s:.3f} ms; "
            f"tokens={dt} mean={1e3 * (now[3] - last[3]) / dt:.3f} ms max={1e3 * t.max_s:.3f} ms {logfmt.EMULATED_MARK}",
            file="epdbench_sim.py")
        last = now


# --- periodic transport metrics (MC_TE_METRIC=1 style) -------------------------------------------
def nixl_stats_line(w: TransferWindow, failed: int) -> str:
    """NixlConnector's `KV Transfer metrics` line (vLLM 0.32/0.33 nixl/stats.py), MB as bytes / 2**20."""
    lat = sorted(w.lat_ms)
    p90 = lat[min(len(lat) - 1, int(0.9 * len(lat)))] if lat else 0.0
    avg = sum(lat) / len(lat) if lat else 0.0
    mb = w.n_bytes / 2 ** 20
    return (f"KV Transfer metrics: Num successful transfers={w.count}, Avg xfer time (ms)={avg:.3f}, "
            f"P90 xfer time (ms)={p90:.3f}, Avg post time (ms)=0.0, P90 post time (ms)=0.0, "
            f"Avg MB per transfer={mb / max(1, w.count):.3f}, Throughput (MB/s)={mb / max(sum(lat) / 1e3, 1e-9):.3f}, "
            f"Avg number of descriptors={w.descriptors / max(1, w.count):.1f}, Num failed transfers={failed}, "
            f"Num KV expired reqs=0, Num notifs after expiry=0")


async def metrics_windows(replica: Replica, interval_s: float) -> None:
    kv = replica.kv
    if kv.nixl:
        await nixl_windows(replica, interval_s)
        return
    last = {"transfers": 0, "failed": 0, "recv_failed": 0}
    while True:
        await asyncio.sleep(interval_s)
        w = kv.window
        if w.count and not kv.genuine:
            mb_s = w.n_bytes / 1e6 / (interval_s / replica.time_scale)   # over the modelled window
            lat = sorted(w.lat_ms)
            under_1ms = sum(1 for x in lat if x < 1) / len(lat) * 100
            replica.mc_log(f"[Metrics] Transfer Engine Stats (over last {interval_s:g}s): Throughput: "
                           f"{mb_s:.2f} MB/s | Latency Distribution (count={len(lat)}): "
                           f"0-1000μs:{under_1ms:.1f}%, >1000μs:{100 - under_1ms:.1f}%")
            kv.window = TransferWindow()
        c = replica.counters
        new = {"transfers": c.kv_transfers, "failed": c.kv_failed_transfers, "recv_failed": c.kv_failed_recvs}
        if new != last:
            # Mooncake pushes from Prefill: successes are reported there, failures on Decode.
            dn = new["transfers"] - last["transfers"] if replica.role == "prefill" else 0
            avg_mb = (c.kv_bytes / c.kv_transfers / 1e6) if c.kv_transfers else 0.0
            replica.api_log(
                f"KV Transfer metrics: Num successful transfers={dn}, Avg MB per transfer={avg_mb:.1f}, "
                f"Num failed transfers={new['failed'] - last['failed']}, "
                f"Num failed recvs={new['recv_failed'] - last['recv_failed']}, Num KV expired reqs=0"
                f"{kv.mark}", file="metrics.py", line=103)
            last = new


async def nixl_windows(replica: Replica, interval_s: float) -> None:
    """The decode's NixlConnector stats line every interval with READs or failures (vLLM logs none when idle)."""
    kv, failed_before = replica.kv, 0
    while True:
        await asyncio.sleep(interval_s)
        failed = replica.counters.kv_failed_recvs
        if replica.role == "decode" and (kv.window.count or failed != failed_before):
            replica.api_log(f"{nixl_stats_line(kv.window, failed - failed_before)} {logfmt.EMULATED_MARK}",
                            file="metrics.py", line=108)
            kv.window, failed_before = TransferWindow(), failed
