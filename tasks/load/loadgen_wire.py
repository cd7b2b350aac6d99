"""What an in-cluster load generator (`epdbench loadgen`, run as a Job) writes to stdout and the runner reads
back through `pods/log` (pure): one JSON line per finished request, one per finished cell with its noise
figures, and a last line with the count of request lines and the SHA-256 of their bytes, so a log cut short
(pod evicted, log rotated, read interrupted) is detected instead of silently losing records.

    {"epdbench": "record", "cell": "fixed|512/64|c8|main", "trial": 0, "record": {...}}
    {"epdbench": "cell", "cell": "fixed|512/64|c8|main", "trial": 0, "noise": {...}}
    {"epdbench": "end", "records": 128, "sha256": "…"}

Any other line (warnings on stderr, which shares the pod log) is ignored.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

KEY = "epdbench"


class LoadgenOutput:
    """Formats the lines and keeps the running count and checksum of the record lines."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.records = 0

    def record(self, cell: str, trial: int, record: dict) -> str:
        line = json.dumps({KEY: "record", "cell": cell, "trial": trial, "record": record}, separators=(",", ":"))
        self._hash.update(line.encode() + b"\n")
        self.records += 1
        return line

    @staticmethod
    def cell(cell: str, trial: int, noise: dict) -> str:
        return json.dumps({KEY: "cell", "cell": cell, "trial": trial, "noise": noise}, separators=(",", ":"))

    def end(self) -> str:
        return json.dumps({KEY: "end", "records": self.records, "sha256": self._hash.hexdigest()})


@dataclass
class LoadgenResult:
    records: list[dict] = field(default_factory=list)     # each with its "cell" and "trial"
    noise: dict[tuple[str, int], dict] = field(default_factory=dict)
    complete: bool = False
    problem: str | None = None                            # why the output cannot be trusted whole


def parse_output(lines) -> LoadgenResult:
    """Records and cell noise from a load generator's log lines; `complete` only when the end line is there
    and its count and checksum match the record lines read (else `problem` says what is missing)."""
    out = LoadgenResult()
    digest = hashlib.sha256()
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.startswith("{"):
            continue
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        kind = item.get(KEY)
        if kind == "record" and isinstance(item.get("record"), dict):
            digest.update(line.encode() + b"\n")
            out.records.append({**item["record"], "cell": item.get("cell"), "trial": item.get("trial")})
        elif kind == "cell" and isinstance(item.get("noise"), dict):
            out.noise[(str(item.get("cell")), int(item.get("trial") or 0))] = item["noise"]
        elif kind == "end":
            if item.get("records") != len(out.records):
                out.problem = f"the end line counts {item.get('records')} records, the log holds {len(out.records)}"
            elif item.get("sha256") != digest.hexdigest():
                out.problem = "the records' checksum does not match the end line (a line was altered or lost)"
            else:
                out.complete = True
            return out
    out.problem = f"no end line after {len(out.records)} records: the load generator's log was cut short"
    return out
