"""The offline GPU bundle for a host without network (vLLM's environment and epdbench's), as data: which files of a
wheel to leave out and their RECORD without them, which wheels each environment's requirements reach on the host
(and which the host's image or a reason covers), what the kept ELF files need from the host, how one tar splits into
parts, and the manifest that install.sh reads. No file or network I/O here: the build (wheelhouse_build.py) feeds
these functions what it read and writes what they return."""
from __future__ import annotations

import csv
import io
import re
from collections import deque
from dataclasses import dataclass, field
from email.parser import HeaderParser

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

RECORD_SUFFIX = ".dist-info/RECORD"


class WheelhouseError(ValueError):
    """The bundle cannot be made as asked; the message is one line naming what and the fix."""


@dataclass(frozen=True)
class Wheel:
    """One wheel file as the closure sees it: its distribution, version and Requires-Dist lines."""
    file: str
    name: str
    version: str
    requires: tuple[str, ...] = ()


def wheel_identity(file: str) -> tuple[str, str]:
    """(canonical name, version) from a wheel's file name; WheelhouseError for a name that is not a wheel's."""
    try:
        name, version, _build, _tags = parse_wheel_filename(file)
    except (InvalidWheelFilename, InvalidVersion) as e:
        raise WheelhouseError(f"{file}: not a wheel file name ({e})") from None
    return canonicalize_name(name), str(version)


def requires_dist(metadata_text: str) -> tuple[str, ...]:
    """The Requires-Dist lines of a wheel's METADATA."""
    return tuple(HeaderParser().parsestr(metadata_text).get_all("Requires-Dist") or ())


def oldest_glibc(file: str) -> tuple[int, int] | None:
    """The oldest glibc any tag of this wheel runs on ((2, 17) for manylinux2014); None for a pure wheel."""
    best = None
    for tag in parse_wheel_filename(file)[3]:
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", tag.platform)
        legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
        got = (int(m[1]), int(m[2])) if m else next((v for k, v in legacy.items()
                                                     if tag.platform.startswith(k + "_")), None)
        if got and (best is None or got < best):
            best = got
    return best


def needed_glibc(files) -> str:
    """The glibc a host needs for every wheel in `files`: the newest of each wheel's oldest tag."""
    versions = [v for v in map(oldest_glibc, files) if v]
    return "%d.%d" % max(versions) if versions else "any"


# ---- wheels, trimmed ----------------------------------------------------------------------------------------------

def trim_plan(entries: list[str], trims: dict[str, str], wheel: str = "vllm") -> dict[str, str]:
    """{entry: reason} of the wheel's entries that `trims` leaves out (a key ending in / takes the folder). Every
    trim must match: a release that moved a file is refused, not silently shipped whole."""
    removed: dict[str, str] = {}
    for path, reason in trims.items():
        hits = [e for e in entries if (e.startswith(path) if path.endswith("/") else e == path)]
        if not hits:
            raise WheelhouseError(f"the {wheel} wheel has no {path}: the trims in wheelhouse_pins.py are for another "
                                  f"{wheel} release; read where this one loads it and update TRIMS")
        removed.update(dict.fromkeys(hits, reason))
    if any(e.endswith(RECORD_SUFFIX) or ".dist-info/" in e for e in removed):
        raise WheelhouseError("a trim reaches the wheel's .dist-info folder; only package files may be left out")
    return removed


def rewrite_record(record_text: str, removed) -> str:
    """The wheel's RECORD without the rows of `removed` (the other rows, hashes and sizes unchanged, since their
    files are copied as they are); pip checks that the RECORD names exactly the wheel's files."""
    gone = set(removed)
    rows = [row for row in csv.reader(io.StringIO(record_text)) if row and row[0] not in gone]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def trimmed_summary(removed: dict[str, str], sizes: dict[str, int], trims: dict[str, str]) -> list[dict]:
    """One row per trim of the manifest: path, files, bytes unpacked, reason."""
    rows = []
    for path, reason in trims.items():
        hits = [e for e, r in removed.items() if r == reason and (e == path or e.startswith(path))]
        rows.append({"path": path, "files": len(hits), "bytes": sum(sizes.get(e, 0) for e in hits),
                     "reason": reason})
    return rows


# ---- the requirement closure -------------------------------------------------------------------------------------

@dataclass
class Closure:
    """What vLLM's requirements reach on the host, walked from the root wheel with the host's markers."""
    carried: dict[str, list[str]] = field(default_factory=dict)        # wheel name -> required by
    from_image: dict[str, list[dict]] = field(default_factory=dict)    # name -> [{by, spec}]
    dropped: dict[str, list[str]] = field(default_factory=dict)        # name -> required by
    missing: list[tuple[str, str]] = field(default_factory=list)       # (name, required by)
    unsatisfied: list[dict] = field(default_factory=list)              # {name, spec, have, by}
    unused: list[str] = field(default_factory=list)                    # wheels nothing requires
    stale_drops: list[str] = field(default_factory=list)               # reasons for what nothing requires

    def problems(self) -> list[str]:
        """What makes the bundle wrong: a requirement met by nothing, a carried version its requirement refuses,
        a wheel nothing needs, a drop reason for something nothing requires (the pins are for another release)."""
        return ([f"{name} (required by {by}) is neither carried, in the image, nor dropped with a reason"
                 for name, by in self.missing]
                + [f"{u['name']} {u['have']} is carried but {u['by']} requires {u['name']}{u['spec']}"
                   for u in self.unsatisfied if u["where"] == "bundle"]
                + [f"{name} is carried but nothing requires it" for name in self.unused]
                + [f"{name} is dropped with a reason but nothing requires it" for name in self.stale_drops])


def _applies(req: Requirement, extras: frozenset[str], markers: dict[str, str]) -> bool:
    if req.marker is None:
        return True
    try:
        return any(req.marker.evaluate({**markers, "extra": e}) for e in (extras or {""}))
    except UndefinedEnvironmentName:
        return False


def _satisfied(spec, version: str | None) -> bool | None:
    if version is None or not str(spec):
        return None if version is None else True
    return spec.contains(version, prereleases=True)


def closure(roots: list[str], wheels: dict[str, Wheel], image: set[str], image_versions: dict[str, str],
            dropped: dict[str, str], markers: dict[str, str], root_extras: dict[str, tuple[str, ...]] | None = None
            ) -> Closure:
    """Walk Requires-Dist from `roots` (keys of `wheels`: what the environment is for; `root_extras` the extras
    each is installed with) with each requirement's extras, for the host's markers: a requirement is carried (a
    wheel of the bundle), from the image, dropped (a reason), or missing."""
    out = Closure(carried={root: [] for root in roots})
    seen: dict[str, frozenset[str]] = {root: frozenset(map(canonicalize_name, (root_extras or {}).get(root, ())))
                                       for root in roots}
    todo = deque(seen.items())
    walked: set[tuple[str, str]] = set()        # (wheel, requirement) already taken: a later extra adds, not repeats
    while todo:
        name, extras = todo.popleft()
        wheel = wheels[name]
        for line in wheel.requires:
            if (name, line) in walked:
                continue
            try:
                req = Requirement(line)
            except InvalidRequirement as e:
                raise WheelhouseError(f"{wheel.file}: unreadable requirement {line!r} ({e})") from None
            if not _applies(req, extras, markers):
                continue
            walked.add((name, line))
            dep, by = canonicalize_name(req.name), f"{wheel.name} {wheel.version}"
            if dep in dropped:
                out.dropped.setdefault(dep, []).append(by)
            elif dep in image:
                out.from_image.setdefault(dep, []).append({"by": by, "spec": str(req.specifier)})
                if _satisfied(req.specifier, image_versions.get(dep)) is False:
                    out.unsatisfied.append({"name": dep, "spec": str(req.specifier), "have": image_versions[dep],
                                            "by": by, "where": "image"})
            elif dep in wheels:
                out.carried.setdefault(dep, []).append(by)
                if _satisfied(req.specifier, wheels[dep].version) is False:
                    out.unsatisfied.append({"name": dep, "spec": str(req.specifier), "have": wheels[dep].version,
                                            "by": by, "where": "bundle"})
                want = seen.get(dep, frozenset()) | frozenset(map(canonicalize_name, req.extras))
                if dep not in seen or want != seen[dep]:
                    seen[dep] = want
                    todo.append((dep, want))
            else:
                out.missing.append((dep, by))
    out.unused = sorted(set(wheels) - set(out.carried))
    out.stale_drops = sorted(set(dropped) - set(out.dropped))
    return out


def pick_wheels(files: list[str], pins: dict[str, str]) -> dict[str, str]:
    """{name: file} of the pinned wheels among `files` (one file each); WheelhouseError naming a pin with none.
    Of several files for one pin (another platform tag from an earlier download), the oldest glibc wins."""
    found: dict[str, list[str]] = {}
    for f in files:
        if f.endswith(".whl"):
            name, version = wheel_identity(f)
            if pins.get(name) is not None and Version(pins[name]) == Version(version):
                found.setdefault(name, []).append(f)
    lacking = sorted(set(pins) - set(found))
    if lacking:
        raise WheelhouseError(f"no wheel for {', '.join(f'{n}=={pins[n]}' for n in lacking)} among the downloads")
    return {n: sorted(fs, key=lambda f: (oldest_glibc(f) or (0, 0), f))[0] for n, fs in found.items()}


# ---- parts and manifest ------------------------------------------------------------------------------------------

def part_ranges(total: int, part_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of each part of a `total`-byte file cut every `part_bytes` (the last one shorter)."""
    if part_bytes < 1:
        raise WheelhouseError(f"part size {part_bytes} bytes: must be at least 1")
    return [(off, min(part_bytes, total - off)) for off in range(0, total, part_bytes)] or [(0, 0)]


def part_name(stem: str, index: int) -> str:
    """The file name of part `index` (0-based): STEM.tar.001, .002, …"""
    return f"{stem}.tar.{index + 1:03d}"


def from_image_checks(found: Closure, notes: dict[str, str], image_versions: dict[str, str]) -> list[dict]:
    """What install.sh checks of the host's own packages: each requirement the image must meet, as the manifest
    lists it (name, the specifier, who asks, the version read on a device machine where known, a note)."""
    return [{"name": name, "spec": r["spec"], "by": r["by"], "known_version": image_versions.get(name),
             **({"note": notes[name]} if name in notes else {})}
            for name in sorted(found.from_image) for r in found.from_image[name]]


def environment(found: Closure, *, roots, default_venv: str, dropped: dict[str, str], image_checks: list[dict],
                import_check, engine_env: dict[str, str], commands=(), extras=()) -> dict:
    """One environment of the manifest: where it goes, what it is for, what it leaves out and why, what install.sh
    checks of the image and imports, the variables it sets and the commands it runs once made."""
    return {"default_venv": default_venv, "roots": list(roots), "extras": list(extras),
            "dropped": {n: {"reason": dropped[n], "required_by": sorted(set(found.dropped.get(n, [])))}
                        for n in sorted(dropped)},
            "from_image": image_checks,
            "known_conflicts": [u for u in found.unsatisfied if u["where"] == "image"],
            "import_check": list(import_check), "engine_env": dict(engine_env),
            "commands": [list(c) for c in commands]}


def wheel_rows(files: list[dict], env_files: dict[str, dict[str, str]], founds: dict[str, Closure]) -> list[dict]:
    """The manifest's wheels, one row per file: which environments take it (`env_files`: env -> {name: file}; a
    wheel both walks reach at one version is carried once) and who requires it there."""
    rows = []
    for w in sorted(files, key=lambda w: (w["name"], w["version"])):
        envs = [env for env, found in founds.items()
                if env_files[env].get(w["name"]) == w["file"] and w["name"] in found.carried]
        rows.append({**w, "envs": envs,
                     "required_by": sorted({by for env in envs for by in founds[env].carried.get(w["name"], [])})})
    return rows


def build_manifest(*, stem: str, pins: dict, target: dict, wheels: list[dict], trimmed: dict[str, list[dict]],
                   environments: dict[str, dict], system_libs: dict, tar: dict, parts: list[dict]) -> dict:
    """The manifest.json beside the parts: everything install.sh verifies and installs, and every version and
    reason the bundle stands on."""
    return {"format": 2, "bundle": stem, "pins": pins, "target": target, "tar": tar, "parts": parts,
            "wheels": wheels, "trimmed": trimmed, "environments": environments, "system_libs": system_libs}


# ---- ELF files of the wheels ---------------------------------------------------------------------------------------

def trim_needed_problems(kept_needed: dict[str, list[str]], removed) -> list[str]:
    """A trim that removes a library that a kept ELF file of the same wheel NEEDS (by its file name)."""
    gone = {path.rsplit("/", 1)[-1]: path for path in removed}
    return [f"{path} NEEDS {lib}, which a trim removes ({gone[lib]})"
            for path, needed in sorted(kept_needed.items()) for lib in needed if lib in gone]


def outside_needed(kept_needed: dict[str, list[str]], base) -> list[str]:
    """The sonames the kept ELF files NEED that neither the wheel itself (a file of that name) nor `base` (glibc's
    and the host's) provides: what the host must have or the bundle carry."""
    inside = {path.rsplit("/", 1)[-1] for path in kept_needed}
    return sorted({lib for needed in kept_needed.values() for lib in needed} - inside - set(base))
