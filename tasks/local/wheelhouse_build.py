"""Build the offline GPU bundle for a host without network (`epdbench engine-env --wheelhouse DIR`): vLLM's
environment (vLLM, NIXL and Mooncake's transfer engine written again without the files the host never loads, the
rest of their requirements, the Debian packages of the engine's system libraries) and epdbench's (its wheel and its
requirements), as one tar cut into parts of at most PART_MIB MiB, with manifest.json and install.sh beside them.
What to carry, drop and check is decided in wheelhouse.py and syslibs.py; the downloads in wheelhouse_fetch.py."""
from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import tempfile
import time
import zipfile
from importlib.resources import files as package_files
from pathlib import Path

from epdbench.tasks.local import syslibs
from epdbench.tasks.local import wheelhouse_fetch as fetch
from epdbench.tasks.local import wheelhouse_pins as pins
from epdbench.tasks.local.wheelhouse import (RECORD_SUFFIX, Wheel, WheelhouseError, build_manifest, closure,
                                             environment, from_image_checks, needed_glibc, outside_needed, part_name,
                                             part_ranges, requires_dist, rewrite_record, trim_needed_problems,
                                             trim_plan, trimmed_summary, wheel_identity, wheel_rows)

STEM = f"epdbench-gpu-vllm-{pins.VLLM_VERSION}"
MANIFEST = "manifest.json"
INSTALLER = "install.sh"
TOOL = "tools/syslibs.py"            # in the tar: what install.sh and vLLM's environment run of syslibs.py
CHUNK = fetch.CHUNK
sha256_file = fetch.sha256_file
default_downloads_dir = fetch.default_downloads_dir


def read_wheel(path: Path) -> Wheel:
    """A wheel's name, version and Requires-Dist, read from its METADATA."""
    name, version = wheel_identity(path.name)
    try:
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
            return Wheel(path.name, name, version, requires_dist(z.read(meta).decode("utf-8")))
    except (zipfile.BadZipFile, StopIteration, OSError) as e:
        raise WheelhouseError(f"{path}: unreadable wheel ({type(e).__name__}); delete it and build again") from None


def trim_wheel(src: Path, dst: Path, trims: dict[str, str], elf: bool = False) -> tuple[list[dict], dict]:
    """Write `src` again as `dst` without `trims`, its RECORD rewritten; every other file as it was (name, date,
    mode, compression). Returns the manifest's rows of what was left out and, with `elf`, {path: NEEDED} of every
    kept shared library (a trim that removes one a kept file NEEDS is refused)."""
    kept_needed: dict[str, list[str]] = {}
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        removed = trim_plan([i.filename for i in infos], trims, wheel_identity(src.name)[0])
        record = next(i for i in infos if i.filename.endswith(RECORD_SUFFIX) and i.filename.count("/") == 1)
        if elf:
            for info in infos:
                if info.filename not in removed and ".so" in info.filename.rsplit("/", 1)[-1]:
                    data = zin.read(info)
                    if data[:4] == b"\x7fELF":
                        kept_needed[info.filename] = syslibs.elf_dynamic(data)[1]
            problems = trim_needed_problems(kept_needed, removed)
            if problems:
                raise WheelhouseError(f"{src.name}: {problems[0]}; keep it (TRIMS in wheelhouse_pins.py)")
        with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in infos:
                if info.filename in removed:
                    continue
                new = zipfile.ZipInfo(info.filename, info.date_time)
                new.external_attr, new.create_system = info.external_attr, info.create_system
                new.compress_type, new.file_size = info.compress_type, info.file_size
                if info is record:
                    zout.writestr(new, rewrite_record(zin.read(info).decode("utf-8"), removed))
                    continue
                with zin.open(info) as r, zout.open(new, "w", force_zip64=info.file_size > 2**31) as w:
                    shutil.copyfileobj(r, w, CHUNK)
    return trimmed_summary(removed, {i.filename: i.file_size for i in infos}, trims), kept_needed


def write_tar(members: list[tuple[Path, str]], tar_path: Path) -> None:
    """One uncompressed tar of (file, name in the tar), the same bytes for the same files (no times, owners)."""
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, arcname in sorted(members, key=lambda m: m[1]):
            info = tar.gettarinfo(str(path), arcname=arcname)
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with open(path, "rb") as fh:
                tar.addfile(info, fh)


def split_file(path: Path, out_dir: Path, part_bytes: int) -> list[dict]:
    """Cut `path` into parts of `part_bytes` in `out_dir`; their names, sizes and sha256."""
    parts = []
    with open(path, "rb") as src:
        for i, (_offset, length) in enumerate(part_ranges(path.stat().st_size, part_bytes)):
            name, h, left = part_name(STEM, i), hashlib.sha256(), length
            with open(out_dir / name, "wb") as dst:
                while left:
                    block = src.read(min(CHUNK, left))
                    h.update(block)
                    dst.write(block)
                    left -= len(block)
            parts.append({"file": name, "bytes": length, "sha256": h.hexdigest()})
    return parts


def check_bundle_dir(out_dir: Path) -> None:
    """The folder takes a bundle: new, empty, or holding an earlier bundle (whose files are replaced)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise WheelhouseError(f"--wheelhouse {out_dir}: is a file; give a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).exists():
        raise WheelhouseError(f"--wheelhouse {out_dir}: not empty and holds no bundle ({MANIFEST}); give a new or "
                              "empty folder")


def _remove_earlier_bundle(out_dir: Path) -> None:
    try:
        old = json.loads((out_dir / MANIFEST).read_text())
        names = [p["file"] for p in old.get("parts", [])]
    except (OSError, ValueError, TypeError, KeyError):
        names = []
    for name in [*names, MANIFEST, INSTALLER]:
        (out_dir / Path(name).name).unlink(missing_ok=True)


def _closed(found, what: str) -> None:
    problems = found.problems()
    if problems:
        raise WheelhouseError(f"the pins do not close {what}'s requirements: {problems[0]}"
                              + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def read_debs(debs: dict[str, Path]) -> list[dict]:
    """The manifest's rows of the carried Debian packages, with each one's shared libraries; refused unless they
    hold exactly what the transfer engine's roots reach on a host that has only SYSTEM_HOST_BASE."""
    rows = []
    for package, path in debs.items():
        try:
            libs = syslibs.deb_libraries(path.read_bytes())
        except (syslibs.SyslibsError, OSError, tarfile.TarError) as e:
            raise WheelhouseError(f"{path.name}: unreadable Debian package ({e})") from None
        rows.append({"package": package, "version": pins.SYSTEM_DEBS[package][0], "file": path.name,
                     "bytes": path.stat().st_size, "sha256": pins.SYSTEM_DEBS[package][2], "libs": libs})
    problems = syslibs.carried_problems(rows, pins.SYSTEM_LIB_ROOTS, pins.SYSTEM_HOST_BASE)
    if problems:
        raise WheelhouseError(f"SYSTEM_DEBS do not close the transfer engine's libraries: {problems[0]}")
    return rows


def trim_all(sources: dict[str, Path], tmp: Path, say) -> dict[str, list[dict]]:
    """Every wheel of TRIMS written again into `tmp` (`sources` then names the trimmed file); the manifest's rows.
    The system-library wheel's kept ELF files must NEED, outside it, exactly SYSTEM_LIB_ROOTS beyond the base."""
    trimmed = {}
    for name, trims in pins.TRIMS.items():
        say(f"writing {name}'s wheel without {len(trims)} part(s) the GPU host never loads ...")
        dst = tmp / sources[name].name
        trimmed[name], needed = trim_wheel(sources[name], dst, trims, elf=name == pins.SYSTEM_LIBS_WHEEL)
        sources[name] = dst
        if name == pins.SYSTEM_LIBS_WHEEL:
            outside = outside_needed(needed, set(pins.SYSTEM_HOST_BASE) | syslibs.GLIBC)
            if outside != sorted(pins.SYSTEM_LIB_ROOTS):
                raise WheelhouseError(f"{name}'s kept libraries need {', '.join(outside)} from the host; "
                                      f"SYSTEM_LIB_ROOTS says {', '.join(sorted(pins.SYSTEM_LIB_ROOTS))}: update it")
    return trimmed


def build_bundle(out_dir: Path, downloads: Path | None = None, vllm_wheel: Path | None = None,
                 part_mib: int = pins.PART_MIB, say=print, epdbench_root: Path | None = None) -> dict:
    """Build the bundle into `out_dir`; its manifest. Raises WheelhouseError (one line) on any step that fails."""
    start = time.monotonic()
    check_bundle_dir(out_dir)
    downloads = downloads or default_downloads_dir()
    vllm_src, deps, epd_deps = fetch.gather_wheels(downloads, vllm_wheel, say)
    debs = fetch.fetch_debs(downloads, pins.SYSTEM_DEBS, say)
    vllm = read_wheel(vllm_src)
    if (vllm.name, vllm.version) != ("vllm", pins.VLLM_VERSION):
        raise WheelhouseError(f"{vllm_src.name}: not vllm {pins.VLLM_VERSION}, the version the pins are for")
    with tempfile.TemporaryDirectory(prefix="epdbench-wheel-") as wheel_dir:
        say("building epdbench's wheel from the checkout ...")
        epd_src = fetch.build_epdbench_wheel(Path(wheel_dir), epdbench_root)
        epd = read_wheel(epd_src)
        wheels = {"vllm": {"vllm": vllm, **{n: read_wheel(p) for n, p in deps.items()}},
                  "epdbench": {"epdbench": epd, **{n: read_wheel(p) for n, p in epd_deps.items()}}}
        founds = {"vllm": closure(list(pins.VLLM_ROOTS), wheels["vllm"], set(pins.IMAGE_PACKAGES),
                                  pins.IMAGE_VERSIONS, pins.DROPPED, pins.TARGET_MARKERS),
                  "epdbench": closure(["epdbench"], wheels["epdbench"], set(pins.IMAGE_PACKAGES),
                                      pins.IMAGE_VERSIONS, pins.EPDBENCH_DROPPED, pins.TARGET_MARKERS,
                                      {"epdbench": pins.EPDBENCH_EXTRAS})}
        _closed(founds["vllm"], "vLLM's environment")
        _closed(founds["epdbench"], "epdbench's environment")
        packages = read_debs(debs)
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=out_dir) as tmp:
            sources = {"vllm": vllm_src, **deps}
            trimmed = trim_all(sources, Path(tmp), say)
            _remove_earlier_bundle(out_dir)
            files = {p.name: p for p in [*epd_deps.values(), epd_src, *sources.values()]}   # one per wheel
            tool = Path(tmp) / "syslibs.py"
            tool.write_bytes(package_files("epdbench.tasks.local").joinpath("syslibs.py").read_bytes())
            members = ([(p, f"wheels/{n}") for n, p in files.items()]
                       + [(p, f"debs/{p.name}") for p in debs.values()] + [(tool, TOOL)])
            tar_path = Path(tmp) / f"{STEM}.tar"
            write_tar(members, tar_path)
            say(f"cutting {tar_path.stat().st_size / 2**20:.0f} MiB into parts of {part_mib} MiB ...")
            tar = {"file": tar_path.name, "bytes": tar_path.stat().st_size, "sha256": sha256_file(tar_path)}
            parts = split_file(tar_path, out_dir, part_mib * 2**20)
            rows = [{"file": n, "name": wheel_identity(n)[0], "version": wheel_identity(n)[1],
                     "bytes": p.stat().st_size, "sha256": sha256_file(p)} for n, p in files.items()]
    env_files = {"vllm": {n: p.name for n, p in sources.items()},
                 "epdbench": {"epdbench": epd_src.name, **{n: p.name for n, p in epd_deps.items()}}}
    manifest = build_manifest(
        stem=STEM, pins={"vllm": pins.VLLM_VERSION, "nixl": pins.NIXL_VERSION, "mooncake": pins.MOONCAKE_VERSION,
                         "epdbench": epd.version, "python": pins.TARGET_PYTHON,
                         "dependencies": pins.DEPENDENCY_PINS, "epdbench_dependencies": pins.EPDBENCH_DEPENDENCY_PINS,
                         "system_debs": {n: v[0] for n, v in pins.SYSTEM_DEBS.items()}},
        target={"python": pins.TARGET_PYTHON, "python_path": pins.TARGET_PYTHON_PATH,
                "glibc": needed_glibc(files), "platforms": list(pins.TARGET_PLATFORMS)},
        wheels=wheel_rows(rows, env_files, founds), trimmed=trimmed,
        environments={
            "vllm": environment(founds["vllm"], roots=pins.VLLM_ROOTS, default_venv=pins.DEFAULT_VENV,
                                dropped=pins.DROPPED, import_check=pins.IMPORT_CHECK, engine_env=pins.ENGINE_ENV,
                                image_checks=from_image_checks(founds["vllm"], pins.IMAGE_NOTES, pins.IMAGE_VERSIONS)),
            "epdbench": environment(founds["epdbench"], roots=["epdbench"], extras=pins.EPDBENCH_EXTRAS,
                                    default_venv=pins.EPDBENCH_DEFAULT_VENV, dropped=pins.EPDBENCH_DROPPED,
                                    import_check=pins.EPDBENCH_IMPORT_CHECK, engine_env={},
                                    commands=[["epdbench", "--help"]],
                                    image_checks=from_image_checks(founds["epdbench"], {}, pins.IMAGE_VERSIONS))},
        system_libs={"env": "vllm", "wheel": pins.SYSTEM_LIBS_WHEEL, "roots": list(pins.SYSTEM_LIB_ROOTS),
                     "triggers": list(pins.SYSTEM_LIBS_TRIGGERS), "host_base": pins.SYSTEM_HOST_BASE, "tool": TOOL,
                     "packages": packages},
        tar=tar, parts=parts)
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    installer = out_dir / INSTALLER
    installer.write_bytes(package_files("epdbench.tasks.local").joinpath(INSTALLER).read_bytes())
    installer.chmod(0o755)
    say(f"bundle {out_dir}: {len(parts)} parts, {tar['bytes'] / 2**20:.0f} MiB, {len(rows)} wheels, "
        f"{len(packages)} Debian packages ({time.monotonic() - start:.0f}s)")
    return manifest
