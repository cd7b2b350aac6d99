"""Build the offline vLLM bundle for a GPU host without network (`epdbench engine-env --wheelhouse DIR`): download
the pinned wheels (pip download, for the host's Python and platform), write vLLM's wheel again without the files
the host never loads, pack every wheel into one tar, cut it into parts of at most PART_MIB MiB, and write
manifest.json and install.sh beside them. What to carry, drop and check is decided in wheelhouse.py."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from importlib.resources import files as package_files
from pathlib import Path

from epdbench.tasks.local import wheelhouse_pins as pins
from epdbench.tasks.local.wheelhouse import (RECORD_SUFFIX, Wheel, WheelhouseError, build_manifest, closure,
                                             from_image_checks, needed_glibc, part_name, part_ranges, pick_wheels,
                                             requires_dist, rewrite_record, trim_plan, trimmed_summary,
                                             wheel_identity)

STEM = f"vllm-{pins.VLLM_VERSION}-gpu-bundle"
MANIFEST = "manifest.json"
INSTALLER = "install.sh"
CHUNK = 1 << 20


def default_downloads_dir() -> Path:
    return Path("~/.cache/epdbench/wheelhouse-downloads").expanduser()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def pip_download(requirements: list[str], dest: Path) -> None:
    """`pip download --no-deps` of exact pins, binary wheels for the host's Python and platform only."""
    platforms = [arg for p in pins.TARGET_PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--python-version", pins.TARGET_PYTHON, "--implementation", "cp", *platforms,
           "-d", str(dest), *requirements]
    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        lines = [x for x in done.stderr.splitlines() if x.startswith("ERROR")] or done.stderr.splitlines() or ["?"]
        raise WheelhouseError(f"pip download failed: {lines[-1][:300]}")


def read_wheel(path: Path) -> Wheel:
    """A wheel's name, version and Requires-Dist, read from its METADATA."""
    name, version = wheel_identity(path.name)
    try:
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
            return Wheel(path.name, name, version, requires_dist(z.read(meta).decode("utf-8")))
    except (zipfile.BadZipFile, StopIteration, OSError) as e:
        raise WheelhouseError(f"{path}: unreadable wheel ({type(e).__name__}); delete it and build again") from None


def trim_wheel(src: Path, dst: Path, trims: dict[str, str]) -> list[dict]:
    """Write `src` again as `dst` without `trims`, its RECORD rewritten; every other file as it was (name, date,
    mode, compression). Returns the manifest's rows of what was left out."""
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        removed = trim_plan([i.filename for i in infos], trims, wheel_identity(src.name)[0])
        record = next(i for i in infos if i.filename.endswith(RECORD_SUFFIX) and i.filename.count("/") == 1)
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
    return trimmed_summary(removed, {i.filename: i.file_size for i in infos}, trims)


def write_tar(members: list[Path], tar_path: Path) -> None:
    """One uncompressed tar of the wheels under wheels/, the same bytes for the same files (no times, owners)."""
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(members, key=lambda p: p.name):
            info = tar.gettarinfo(str(path), arcname=f"wheels/{path.name}")
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


def gather_wheels(downloads: Path, vllm_wheel: Path | None, say) -> tuple[Path, dict[str, Path]]:
    """vLLM's wheel and every pinned dependency's, downloaded into `downloads` where not there yet."""
    downloads.mkdir(parents=True, exist_ok=True)
    if vllm_wheel is None:
        vllm_wheel = downloads / pins.VLLM_WHEEL
        if not vllm_wheel.exists():
            say(f"downloading vllm=={pins.VLLM_VERSION} (about 300 MB) into {downloads} ...")
            pip_download([f"vllm=={pins.VLLM_VERSION}"], downloads)
    try:
        have = pick_wheels([p.name for p in downloads.iterdir()], pins.DEPENDENCY_PINS)
    except WheelhouseError:
        say(f"downloading {len(pins.DEPENDENCY_PINS)} pinned dependencies into {downloads} ...")
        pip_download([f"{n}=={v}" for n, v in pins.DEPENDENCY_PINS.items()], downloads)
        have = pick_wheels([p.name for p in downloads.iterdir()], pins.DEPENDENCY_PINS)
    return vllm_wheel, {n: downloads / f for n, f in have.items()}


def build_bundle(out_dir: Path, downloads: Path | None = None, vllm_wheel: Path | None = None,
                 part_mib: int = pins.PART_MIB, say=print) -> dict:
    """Build the bundle into `out_dir`; its manifest. Raises WheelhouseError (one line) on any step that fails."""
    start = time.monotonic()
    check_bundle_dir(out_dir)
    vllm_src, deps = gather_wheels(downloads or default_downloads_dir(), vllm_wheel, say)
    vllm = read_wheel(vllm_src)
    if (vllm.name, vllm.version) != ("vllm", pins.VLLM_VERSION):
        raise WheelhouseError(f"{vllm_src.name}: not vllm {pins.VLLM_VERSION}, the version the pins are for")
    wheels = {"vllm": vllm, **{n: read_wheel(p) for n, p in deps.items()}}
    found = closure(["vllm", "nixl"], wheels, set(pins.IMAGE_PACKAGES), pins.IMAGE_VERSIONS, pins.DROPPED,
                    pins.TARGET_MARKERS)
    problems = found.problems()
    if problems:
        raise WheelhouseError(f"the pins do not close vLLM's requirements: {problems[0]}"
                              + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_earlier_bundle(out_dir)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out_dir) as tmp:
        sources, trimmed = {"vllm": vllm_src, **deps}, {}
        for name, trims in pins.TRIMS.items():
            say(f"writing {name}'s wheel without {len(trims)} part(s) the GPU host never loads ...")
            dst = Path(tmp) / sources[name].name
            trimmed[name] = trim_wheel(sources[name], dst, trims)
            sources[name] = dst
        members = list(sources.values())
        tar_path = Path(tmp) / f"{STEM}.tar"
        write_tar(members, tar_path)
        say(f"cutting {tar_path.stat().st_size / 2**20:.0f} MiB into parts of {part_mib} MiB ...")
        tar = {"file": tar_path.name, "bytes": tar_path.stat().st_size, "sha256": sha256_file(tar_path)}
        parts = split_file(tar_path, out_dir, part_mib * 2**20)
        rows = [{"file": p.name, "name": wheel_identity(p.name)[0], "version": wheel_identity(p.name)[1],
                 "bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in members]
    manifest = build_manifest(
        stem=STEM, pins={"vllm": pins.VLLM_VERSION, "nixl": pins.NIXL_VERSION, "python": pins.TARGET_PYTHON,
                         "dependencies": pins.DEPENDENCY_PINS},
        target={"python": pins.TARGET_PYTHON, "python_path": pins.TARGET_PYTHON_PATH,
                "glibc": needed_glibc(p.name for p in members), "platforms": list(pins.TARGET_PLATFORMS),
                "default_venv": pins.DEFAULT_VENV},
        wheels=rows, found=found, trimmed=trimmed, dropped=pins.DROPPED,
        image_checks=from_image_checks(found, pins.IMAGE_NOTES, pins.IMAGE_VERSIONS), tar=tar, parts=parts,
        import_check=pins.IMPORT_CHECK, engine_env=pins.ENGINE_ENV)
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    installer = out_dir / INSTALLER
    installer.write_bytes(package_files("epdbench.tasks.local").joinpath(INSTALLER).read_bytes())
    installer.chmod(0o755)
    say(f"bundle {out_dir}: {len(parts)} parts, {tar['bytes'] / 2**20:.0f} MiB, {len(rows)} wheels "
        f"({time.monotonic() - start:.0f}s)")
    return manifest
