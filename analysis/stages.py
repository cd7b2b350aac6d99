"""Did every measured request cross every stage it must? (pure: lines and counters in, dicts out)

From each role's log, in the real formats only (analysis.logformats): uvicorn access lines (completions,
renders, errors), vLLM's `Received request <id>` lines and its `Request <body request_id> JSON body:` lines
(`--enable-log-requests`; behind vllm-router only the latter carry the client's id), so the fraction of
measured request ids seen at each role is known. From vLLM's own /metrics deltas over the same window:
requests finished per role and, on decode pods, prompt tokens computed locally rather than received by
KV transfer — a decode pod that prefilled a request itself (the router skipped the prefill stage)
shows it there, on a real cluster as in the simulator.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from epdbench.analysis.logformats import parse_line

RECEIVED = re.compile(r"Received request (?:chatcmpl|cmpl)-([\w.:-]+?)(?:[:,\s]|$)")
# vLLM names a request by its X-Request-Id header before the body's request_id, and vllm-router sends its
# own header to each leg; the body's request_id (the client's) is in the request-body line, which vLLM
# writes with --enable-log-requests at VLLM_REQUEST_BODY_LOG_LEVEL (the engines run with INFO).
BODY = re.compile(r"Request ([\w.:-]+) JSON body: ")
CHOICE_SUFFIX = re.compile(r"-\d+$")
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
RENDER_PATHS = ("/tokenize", "/detokenize", "/v1/chat/completions/render", "/v1/completions/render")
# A decode leg recomputes the last prompt token itself; more than this per request means local prefills.
LOCAL_TOKENS_PER_DECODE_LEG = 1


def stage_counts(lines: Iterable[str]) -> dict:
    """Completion and render access lines and request ids seen in one process's log slice."""
    out = {"completions": 0, "errors": 0, "renders": 0, "request_ids": set()}
    for raw in lines:
        line = parse_line(raw)
        if line is None:
            continue
        if line.kind == "access":
            path = line.path.split("?")[0]
            if path in COMPLETION_PATHS:
                out["completions" if line.status == 200 else "errors"] += 1
            elif path in RENDER_PATHS:
                out["renders"] += 1
        elif line.kind != "vllm":
            continue
        elif line.file in ("logger.py", "request_logger.py") and (m := RECEIVED.match(line.message)):
            # vLLM logs completions as cmpl-<id>-<choice index>; keep both forms so either matches.
            out["request_ids"].update({m.group(1), CHOICE_SUFFIX.sub("", m.group(1))})
        elif line.file == "request_logger.py" and (m := BODY.match(line.message)):
            out["request_ids"].add(m.group(1))
    return out


def merge_counts(a: dict, b: dict) -> dict:
    return {"completions": a["completions"] + b["completions"], "errors": a["errors"] + b["errors"],
            "renders": a["renders"] + b["renders"], "request_ids": a["request_ids"] | b["request_ids"]}


def local_prefills(metrics_delta: dict[str, dict[str, float]]) -> dict | None:
    """Prompt tokens the decode role computed itself beyond one per decode leg (from vLLM's
    prompt_tokens_by_source and request_success counters); None when the counters are absent."""
    d = metrics_delta.get("decode") or {}
    local, legs = d.get("prompt_tokens_local_compute"), d.get("requests_finished")
    if local is None or legs is None:
        return None
    excess = local - legs * LOCAL_TOKENS_PER_DECODE_LEG
    return {"local_compute_tokens": local, "decode_requests": legs, "excess_tokens": max(0.0, excess),
            "external_kv_tokens": d.get("prompt_tokens_external_kv_transfer")}


def verify_stages(expected_roles: dict[str, list[str]], role_counts: dict[str, dict], emulated: bool,
                  metrics_delta: dict[str, dict[str, float]] | None = None) -> dict:
    """expected_roles: measured request id -> roles it must cross; role_counts: role -> stage_counts;
    metrics_delta: role -> counter deltas over the same window (analysis.prom)."""
    reasons: list[str] = []
    fractions: dict[str, float | None] = {}
    skipped: list[dict] = []
    roles = sorted({r for rs in expected_roles.values() for r in rs})
    for role in roles:
        want = [rid for rid, rs in expected_roles.items() if role in rs]
        seen = role_counts.get(role, {}).get("request_ids", set())
        fractions[role] = sum(1 for rid in want if rid in seen) / len(want) if want else None
        skipped += [{"request_id": rid, "missing_role": role} for rid in want if rid not in seen]
    local = local_prefills(metrics_delta or {}) if "decode" in roles else None
    prefilled_on_decode = bool(local and local["excess_tokens"] > 0)
    if not expected_roles:
        verdict = "no-evidence"
        reasons.append("no measured requests to correlate")
    elif not skipped and not prefilled_on_decode:
        verdict = "emulated" if emulated else "verified"
        reasons.append(f"every measured request was seen at {', '.join(roles)}")
        if "decode" in roles and local is None:
            reasons.append("decode pods expose no prompt_tokens_by_source counter: local prefills not checked")
    else:
        verdict = "mismatch"
        for role, f in fractions.items():
            if f is not None and f < 1:
                reasons.append(f"{role}: {f:.1%} of measured requests seen "
                               f"({sum(1 for s in skipped if s['missing_role'] == role)} skipped it)")
        if prefilled_on_decode:
            reasons.append(f"decode pods computed {local['excess_tokens']:.0f} prompt tokens themselves beyond "
                           f"one per request ({local['decode_requests']:.0f} requests): requests were prefilled "
                           "on a decode pod without KV transfer")
    per_role = {r: {k: (len(v) if isinstance(v, set) else v) for k, v in c.items()} for r, c in role_counts.items()}
    return {"verdict": verdict, "reasons": reasons, "fraction_seen": fractions, "per_role": per_role,
            "skipped": skipped[:100], "n_skipped": len(skipped), "local_prefill": local}
