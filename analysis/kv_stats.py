"""vLLM's `KV Transfer metrics` line (pure): what a KV connector's own stats say moved over one logging interval.

vLLM's stat logger joins the connector's reduced stats as `name=value` pairs: vLLM 0.26
distributed/kv_transfer/kv_connector/v1/metrics.py:103 `log_fn("KV Transfer metrics: %s", ", ".join(f"{k}={v}"
...))`, called by v1/metrics/loggers.py `LoggingStatLogger.log` once per VLLM_LOG_STATS_INTERVAL, at INFO while the
engine is busy and at DEBUG once it is idle (the record names metrics.py, its logger is vllm.v1.metrics.loggers).
The fields are the connector's: MooncakeConnector 0.26 (mooncake/stats.py `reduce`) `Num successful transfers`,
`Avg xfer time (ms)`, `P90 xfer time (ms)`, `Avg MB per transfer`, `Throughput (MB/s)`, `Avg number of descriptors`,
`Num failed transfers`, `Num failed recvs`, `Num KV expired reqs`, MB as bytes / 2**20; NixlConnector's likewise
(nixl/stats.py). Under a MultiConnector a connector's dict is logged instead (`NixlConnector={'Num successful
transfers': 3, ...}`), and vLLM 0.11 named the count `num_successful_transfers`. The line is matched whole in vLLM's
format (analysis.logformats) from the stat logger's file; only its payload is split into fields.
"""
from __future__ import annotations

import re

from epdbench.analysis.logformats import LogLine

KV_METRICS = re.compile(r"KV Transfer metrics: (.*)")
KV_METRICS_FILES = frozenset({"metrics.py", "loggers.py"})
KV_FIELD = re.compile(r"'?(Num successful transfers|num_successful_transfers|Num failed transfers|Num failed recvs"
                      r"|Num KV expired reqs|Avg MB per transfer|Throughput \(MB/s\))'?(?:=|: )([\d.]+)")
MIB = 2 ** 20     # the connectors' stats count MB as bytes / 2**20 (mooncake/stats.py, nixl/stats.py)


def kv_stats(line: LogLine) -> dict[str, float] | None:
    """The fields of a `KV Transfer metrics` line, or None for any other line."""
    if line.kind != "vllm" or line.file not in KV_METRICS_FILES:
        return None
    m = KV_METRICS.fullmatch(line.message)
    return None if m is None else {k: float(v) for k, v in KV_FIELD.findall(m.group(1))}
