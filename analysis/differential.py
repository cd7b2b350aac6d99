"""The protocol differential (pure): the same requests sent to a real vLLM engine and to the simulator, their answers
reduced to what a client or epdbench's pipeline relies on, and compared.

What is compared, per probe: the status code; the JSON key sets and value types of the body (or of every SSE chunk:
the first, the content chunks, the final usage chunk, `data: [DONE]`); the values a client acts on (error type,
code and param, object, finish_reason, completion_tokens, role, whether prompt tokens were served from the prefix
cache); never the model's text, ids, timestamps or the tokenizer's counts. Over the whole exchange: the /metrics
families the pipeline reads (analysis.prom, analysis.transport) with their TYPE and sample names, and the log lines
its parsers anchor on (analysis.logformats, analysis.stages) per probe. Each difference is a (probe, field) pair; the
known ones are listed with their reasons in one file (tests/data/differential/known_differences.yaml), and
`check_known` says which are new and which no longer occur.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from epdbench.analysis.logformats import MODELLED_FIELD, parse_line
from epdbench.analysis.probes import PROBE_ID_PREFIX
from epdbench.analysis.prom import DELTA_COUNTERS
from epdbench.analysis.stages import BODY, RECEIVED

# Values that a client or the pipeline acts on: compared as they are. Keys are paths with list items as `[]`.
COMPARED_VALUES = ("object", "error.type", "error.code", "error.param", "choices[].finish_reason",
                   "choices[].index", "choices[].message.role", "choices[].delta.role", "usage.completion_tokens",
                   "data[].object", "data[].id", "data[].max_model_len", "max_model_len")
# Values compared by their sign only: the prompt was served from the prefix cache, or not.
SIGN_VALUES = ("usage.prompt_tokens_details.cached_tokens",)
# The simulator's own field (its modelled emit time), documented as such: never a difference.
IGNORED_KEYS = (MODELLED_FIELD,)
ABSENT = "(absent)"


def value_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def flatten(obj, prefix: str = "") -> dict[str, str]:
    """path -> type of every value in a JSON document; list items merge under `[]`."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in IGNORED_KEYS:
                continue
            path = f"{prefix}.{k}" if prefix else k
            out[path] = value_type(v)
            out.update(flatten(v, path))
    elif isinstance(obj, list):
        for v in obj:
            path = prefix + "[]"
            seen = out.get(path)
            out[path] = value_type(v) if seen in (None, value_type(v)) else "mixed"
            out.update(flatten(v, path))
    return out


def values(obj, prefix: str = "") -> dict[str, object]:
    """The compared values of a document (COMPARED_VALUES as they are, SIGN_VALUES as zero/positive)."""
    out: dict[str, object] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else k
            if path in COMPARED_VALUES and not isinstance(v, (dict, list)):
                out[path] = v
            elif path in SIGN_VALUES and isinstance(v, (int, float)):
                out[path] = "positive" if v > 0 else "zero"
            out.update(values(v, path))
    elif isinstance(obj, list):
        for v in obj:
            out.update(values(v, prefix + "[]"))
    return out


def sse_events(text: str) -> list[str]:
    """The data of each SSE event, in order."""
    out = []
    for event in text.replace("\r\n", "\n").split("\n\n"):
        data = [line[len("data:"):].strip() for line in event.split("\n") if line.startswith("data:")]
        if data:
            out.append("\n".join(data))
    return out


def chunk_role(chunk: dict) -> str:
    """What an SSE chunk is: `usage` (no choices), `first` (a chat chunk with the role), `final` (a finish_reason),
    else `content`."""
    choices = chunk.get("choices") or []
    if not choices:
        return "usage"
    if any((c.get("delta") or {}).get("role") for c in choices):
        return "first"
    if any(c.get("finish_reason") for c in choices):
        return "final"
    return "content"


def reduce_answer(status: int, content_type: str, text: str) -> dict:
    """An answer as the differential compares it: status, then for JSON its key types and compared values, for an
    SSE stream the same per chunk role (merged over content chunks), in order, and whether `[DONE]` ended it."""
    out: dict = {"status": status}
    kind = "sse" if content_type.startswith("text/event-stream") else "json"
    if kind == "sse":
        parts: dict[str, dict] = {}
        order: list[str] = []
        events = sse_events(text)
        for data in events:
            if data == "[DONE]":
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                parts.setdefault("unparsed", {"types": {}, "values": {}})
                continue
            role = chunk_role(chunk) if "error" not in chunk else "error"
            if not order or order[-1] != role:
                order.append(role)
            part = parts.setdefault(role, {"types": {}, "values": {}})
            part["types"].update(flatten(chunk))
            part["values"].update(values(chunk))
        out.update(body="sse", chunks=parts, order=order, done=bool(events) and events[-1] == "[DONE]")
        return out
    try:
        doc = json.loads(text) if text.strip() else None
    except ValueError:
        out["body"] = "text"
        return out
    out.update(body="json" if doc is not None else "empty", types=flatten(doc), values=values(doc))
    return out


# --- comparing ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    """One field on which the two servers differ: `where` the probe (or `metrics`, `logs`), `what` the field."""
    where: str
    what: str
    real: object
    sim: object

    def line(self) -> str:
        return f"{self.where}: {self.what}: real {self.real!r}, simulator {self.sim!r}"


def _diff_maps(where: str, prefix: str, real: dict, sim: dict) -> list[Difference]:
    """Keys whose type or value differ; a key that is null on one side and absent on the other reads the same to
    every client (`.get`), so it is no difference."""
    out = []
    for key in sorted(set(real) | set(sim)):
        a, b = real.get(key, ABSENT), sim.get(key, ABSENT)
        if a != b and {a, b} != {"null", ABSENT}:
            out.append(Difference(where, f"{prefix}{key}", a, b))
    return out


def compare_answers(name: str, real: dict, sim: dict) -> list[Difference]:
    """Differences between two reduced answers to the same probe."""
    out = []
    for key in ("status", "body", "done", "order"):
        if real.get(key) != sim.get(key):
            out.append(Difference(name, key, real.get(key), sim.get(key)))
    if real.get("body") == sim.get("body") == "sse":
        for role in sorted(set(real["chunks"]) | set(sim["chunks"])):
            a, b = real["chunks"].get(role), sim["chunks"].get(role)
            if a is None or b is None:
                continue          # the order already says one has chunks of that kind and the other not
            out += _diff_maps(name, f"chunks.{role}.types:", a["types"], b["types"])
            out += _diff_maps(name, f"chunks.{role}.values:", a["values"], b["values"])
    elif real.get("body") == sim.get("body") == "json":
        out += _diff_maps(name, "types:", real["types"], sim["types"])
        out += _diff_maps(name, "values:", real["values"], sim["values"])
    return out


# --- /metrics ----------------------------------------------------------------------------------------------------
TYPE_LINE = re.compile(r"^# TYPE (\S+) (\w+)")
SAMPLE_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s")
LABEL_NAME = re.compile(r'(\w+)="')
SUFFIXES = ("_total", "_sum", "_count", "_bucket")


def read_samples() -> set[str]:
    """The vLLM samples epdbench's pipeline reads (analysis.prom's counters; transport's KV histograms among them)."""
    return {name for name, _ in DELTA_COUNTERS.values() if name.startswith("vllm:")}


def declared_type(types: dict[str, str], sample: str) -> tuple[str, str] | None:
    """(TYPE line's name, type) that declares `sample`: its own name (vLLM writes `# TYPE vllm:x_total counter`) or
    its family's (`# TYPE vllm:x histogram` for `vllm:x_sum`)."""
    if sample in types:
        return sample, types[sample]
    for suffix in SUFFIXES:
        if sample.endswith(suffix) and sample[: -len(suffix)] in types:
            return sample[: -len(suffix)], types[sample[: -len(suffix)]]
    return None


def sample_view(text: str, wanted: set[str]) -> dict[str, dict]:
    """sample name -> {declared: `TYPE-name type`, labels: sorted label names} for the wanted samples of a page."""
    types: dict[str, str] = {}
    labels: dict[str, set] = {}
    for line in text.splitlines():
        if m := TYPE_LINE.match(line):
            types[m.group(1)] = m.group(2)
        elif line and not line.startswith("#") and (m := SAMPLE_NAME.match(line)) and m.group(1) in wanted:
            labels.setdefault(m.group(1), set()).update(LABEL_NAME.findall(m.group(2) or ""))
    out = {}
    for sample, names in labels.items():
        declared = declared_type(types, sample)
        out[sample] = {"declared": " ".join(declared) if declared else "(no TYPE line)", "labels": sorted(names)}
    return out


def compare_metrics(real_text: str, sim_text: str, wanted: set[str] | None = None) -> list[Difference]:
    """The samples the pipeline reads, as each server exposes them: present, the TYPE line that declares them
    (name and type), their label names."""
    wanted = read_samples() if wanted is None else wanted
    real, sim = sample_view(real_text, wanted), sample_view(sim_text, wanted)
    out = []
    for sample in sorted(set(real) | set(sim)):
        a, b = real.get(sample), sim.get(sample)
        if a is None or b is None:
            out.append(Difference("metrics", sample, "present" if a else "(absent)", "present" if b else "(absent)"))
            continue
        for key in ("declared", "labels"):
            if a[key] != b[key]:
                out.append(Difference("metrics", f"{sample}.{key}", a[key], b[key]))
    return out


# --- logs --------------------------------------------------------------------------------------------------------
def log_anchors(lines: list[str], names: list[str]) -> dict[str, list[str]]:
    """probe name -> the anchored lines seen for its request id (`PROBE_ID_PREFIX + name`), as analysis.stages reads
    them: `body` (the request-body line), `received` (the `Received request` line); and `access` -> the access lines
    (method path status) in order."""
    out: dict[str, list[str]] = {name: [] for name in names}
    access: list[str] = []
    for raw in lines:
        line = parse_line(raw)
        if line is None:
            continue
        if line.kind == "access":
            access.append(f"{line.method} {line.path} {line.status}")
            continue
        if line.kind != "vllm" or line.file not in ("logger.py", "request_logger.py"):
            continue
        for anchor, pattern in (("body", BODY), ("received", RECEIVED)):
            if (m := pattern.match(line.message)) and m.group(1).startswith(PROBE_ID_PREFIX):
                rid = re.sub(r"-\d+$", "", m.group(1)) if anchor == "received" else m.group(1)
                name = rid[len(PROBE_ID_PREFIX):]
                if name in out and anchor not in out[name]:
                    out[name].append(anchor)
    out["access"] = access
    return out


def compare_logs(real_lines: list[str], sim_lines: list[str], names: list[str]) -> list[Difference]:
    real, sim = log_anchors(real_lines, names), log_anchors(sim_lines, names)
    out = []
    for name in [*names, "access"]:
        if sorted(real[name]) != sorted(sim[name]):
            out.append(Difference("logs", name, sorted(real[name]) or "(none)", sorted(sim[name]) or "(none)"))
    return out


# --- the known differences ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Known:
    """A listed difference: `where` and `what` as fnmatch patterns over a Difference's, and why it is inherent."""
    where: str
    what: str
    reason: str


@dataclass
class Verdict:
    unlisted: list[Difference] = field(default_factory=list)
    stale: list[Known] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unlisted and not self.stale

    def lines(self) -> list[str]:
        return ([f"not listed: {d.line()}" for d in self.unlisted]
                + [f"listed but gone (remove it): {k.where}: {k.what}" for k in self.stale])


def known_from(doc) -> list[Known]:
    """The known-differences file's entries; ValueError naming the entry and field that is wrong."""
    if not isinstance(doc, dict) or not isinstance(doc.get("differences"), list):
        raise ValueError("known differences: a mapping with a list under `differences` is expected")
    out = []
    for i, entry in enumerate(doc["differences"]):
        if not isinstance(entry, dict):
            raise ValueError(f"known differences: entry {i} is not a mapping")
        for key in ("where", "what", "reason"):
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise ValueError(f"known differences: entry {i} needs `{key}` (a non-empty string)")
        extra = set(entry) - {"where", "what", "reason"}
        if extra:
            raise ValueError(f"known differences: entry {i} has unknown keys {sorted(extra)}")
        out.append(Known(entry["where"], entry["what"], entry["reason"].strip()))
    return out


def matches(known: Known, diff: Difference) -> bool:
    return fnmatchcase(diff.where, known.where) and fnmatchcase(diff.what, known.what)


def check_known(found: list[Difference], known: list[Known]) -> Verdict:
    """Differences no entry lists, and entries no difference matched (the list stays short and true)."""
    return Verdict(unlisted=[d for d in found if not any(matches(k, d) for k in known)],
                   stale=[k for k in known if not any(matches(k, d) for d in found)])


def compare_exchanges(real: dict, sim: dict) -> list[Difference]:
    """Every difference between two exchanges of the same probes, each {answers: name -> {status, content_type,
    text}, metrics: /metrics text, log: the engine's log lines over the exchange}."""
    names = list(real["answers"])
    if names != list(sim["answers"]):
        return [Difference("probes", "names", names, list(sim["answers"]))]
    out = []
    for name in names:
        a, b = real["answers"][name], sim["answers"][name]
        out += compare_answers(name, reduce_answer(a["status"], a["content_type"], a["text"]),
                               reduce_answer(b["status"], b["content_type"], b["text"]))
    return out + compare_metrics(real["metrics"], sim["metrics"]) + compare_logs(real["log"], sim["log"], names)
