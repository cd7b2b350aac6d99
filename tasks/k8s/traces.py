"""The runner's side of the in-cluster trace collector (tasks.k8s.incluster_traces): take the spans it holds,
page by page, through the runner's way in to the cluster (tasks.k8s.access), for the run's TraceCollector
(tasks.load.otlp_receiver, `pull`) to join with the records.

Engines name their pod by its Kubernetes name (OTEL_RESOURCE_ATTRIBUTES with the pod's own name); the spans
contract names processes as every target does (prefill-0), so the pod is renamed here. Tracing never fails a
run: a collector that does not answer, restarted, or dropped spans is said once per kind, and the spans that did
come are kept."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

from epdbench.otlp import POD_ATTR

TIMEOUT_S = 10
MAX_PAGES = 100          # per pull: a bounded loop (5,000 spans a page)


class SpanPuller:
    def __init__(self, url: str, process_of_pod: dict[str, str], say: Callable[[str], None],
                 timeout_s: float = TIMEOUT_S):
        self.url = url.rstrip("/") + "/v1/spans"
        self.process_of_pod, self.say, self.timeout_s = process_of_pod, say, timeout_s
        self.epoch: str | None = None
        self.cursor = 0
        self.dropped = 0
        self.problems: set[str] = set()

    def _warn(self, kind: str, line: str) -> None:
        if kind not in self.problems:
            self.problems.add(kind)
            self.say(line)

    def _page(self) -> dict | None:
        query = urllib.parse.urlencode({"after": self.cursor, **({"epoch": self.epoch} if self.epoch else {})})
        try:
            with urllib.request.urlopen(f"{self.url}?{query}", timeout=self.timeout_s) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            self._warn("unreachable", f"  traces: the in-cluster collector did not answer ({e}); spans it holds "
                                      "are missing from the breakdown")
            return None

    def __call__(self) -> list[dict]:
        """Every span the collector holds that this puller has not taken yet."""
        out: list[dict] = []
        for _ in range(MAX_PAGES):
            page = self._page()
            if page is None:
                break
            if self.epoch is not None and page["epoch"] != self.epoch:
                self._warn("restarted", "  traces: the in-cluster collector restarted; the spans it held then are "
                                        "lost")
            self.epoch, self.cursor = page["epoch"], int(page["next"])
            if page["dropped"] > self.dropped:
                self.dropped = page["dropped"]
                self._warn("dropped", f"  traces: the in-cluster collector's buffer was full; {self.dropped} "
                                      "span(s) dropped so far; their requests have no engine spans")
            for span in page["spans"]:
                resource = span.get("resource") or {}
                pod = resource.get(POD_ATTR)
                if pod in self.process_of_pod:
                    span["resource"] = {**resource, POD_ATTR: self.process_of_pod[pod]}
                out.append(span)
            if not page["more"]:
                break
        return out

