"""Names MLflow accepts (pure): every metric, param and tag key built from workload labels, suite, stream or
configuration names goes through `mlflow_names`, which makes each valid and keeps distinct names distinct.

What MLflow accepts (mlflow.utils.validation, `_validate_metric_name` / `_validate_param_name` /
`_validate_tag_name`): alphanumerics, `_`, `-`, `.`, space and `/` (and `:`, except on a Windows server); a name
that posix path normalisation leaves as it is (no empty, `.` or `..` segment between slashes, no leading or
trailing slash); at most 250 characters. Workload labels are often not such names: `1k:560px+624/128`,
`1260px+400/128`, `4096/128@2/s`.

- A valid name is kept as it is, so what was logged before keeps its key.
- Any other character becomes `_` (`goodput_req_s.epd.capacity.1260px+400/128` →
  `goodput_req_s.epd.capacity.1260px_400/128`), `:` included, so a name is valid on every MLflow server (the
  verdict tags always read this way); an empty, `.` or `..` segment between slashes becomes `_`, `_` or `__`;
  a name over 250 characters is cut and ends in `-` and 8 hex digits of its original's sha256.
- Names that would become the same: a name that was valid keeps it, and every other one gets `-` and 8 hex
  digits of its original's sha256 appended (more when even that is taken) — the same whatever their order.
"""
from __future__ import annotations

import hashlib
import posixpath
import re
from collections import defaultdict
from typing import Iterable

MAX_NAME = 250                                  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
_VALID = re.compile(r"^[/\w.\- ]*$")            # MLflow's character rule, without `:` (refused on Windows)
_REFUSED = re.compile(r"[^/\w.\- ]")
_SEGMENT = {"": "_", ".": "_", "..": "__"}     # segments that path normalisation would remove or resolve


def is_valid_name(name: str) -> bool:
    """MLflow takes `name` as a metric, param or tag key on any server."""
    norm = posixpath.normpath(name)
    return (bool(_VALID.match(name)) and len(name) <= MAX_NAME and norm == name and norm != "."
            and not norm.startswith(("..", "/")))


def _digest(original: str, n: int = 8) -> str:
    return hashlib.sha256(original.encode()).hexdigest()[:n]


def _with_tail(name: str, tail: str) -> str:
    """`name` ending in `tail`, cut so the whole stays within MAX_NAME."""
    return name[:MAX_NAME - len(tail)] + tail


def readable_name(original: str) -> str:
    """`original` as a valid name on its own: unchanged when valid, else its refused characters and
    segments replaced (see the module's docstring). Two originals may give the same: see mlflow_names."""
    if is_valid_name(original):
        return original
    name = "/".join(_SEGMENT.get(seg, seg) for seg in _REFUSED.sub("_", original).split("/"))
    return name if len(name) <= MAX_NAME else _with_tail(name, f"-{_digest(original)}")


def mlflow_names(originals: Iterable[str]) -> dict[str, str]:
    """original → the name to log under: valid for MLflow, unchanged when already valid, and never the same
    for two different originals (deterministic: the same set gives the same names in any order)."""
    originals = sorted({str(o) for o in originals})
    made = {o: readable_name(o) for o in originals}
    claims: dict[str, list[str]] = defaultdict(list)
    for o in originals:
        claims[made[o]].append(o)
    taken = set(made.values())
    out = {}
    for o in originals:
        name = made[o]
        if name != o and len(claims[name]) > 1:             # shared with another original
            n = 8
            while _with_tail(name, f"-{_digest(o, n)}") in taken and n < 64:
                n += 8
            name = _with_tail(name, f"-{_digest(o, n)}")
            taken.add(name)
        out[o] = name
    return out


def valid_keys(values: dict) -> dict:
    """`values` with each key as mlflow_names makes it."""
    names = mlflow_names(values)
    return {names[str(k)]: v for k, v in values.items()}
