"""What the GPU bundle's build fetches or makes before packing (`epdbench engine-env --wheelhouse DIR`): the pinned
wheels (pip download, for the host's Python and platform), the Debian packages of the transfer engine's system
libraries (from Debian's mirror, each checked against its pinned sha256), and epdbench's own wheel, built from the
checkout this code runs from. Everything lands in the downloads folder, kept for the next build."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote

from epdbench.tasks.local import wheelhouse_pins as pins
from epdbench.tasks.local.wheelhouse import WheelhouseError, pick_wheels, wheel_identity

CHUNK = 1 << 20
# The checkout's folders that make the epdbench package (pyproject.toml's package-dir), copied to build its wheel.
SOURCE_ITEMS = ("pyproject.toml", "README.md", "epdbench", "physics", "specs", "analysis", "reports", "sim",
                "manifests", "tasks", "flows")


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


def pinned_wheels(downloads: Path, pinned: dict[str, str], what: str, say) -> dict[str, Path]:
    """{name: path} of every pinned wheel, downloaded into `downloads` where not there yet."""
    try:
        have = pick_wheels([p.name for p in downloads.iterdir()], pinned)
    except WheelhouseError:
        say(f"downloading {len(pinned)} pinned {what} into {downloads} ...")
        pip_download([f"{n}=={v}" for n, v in pinned.items()], downloads)
        have = pick_wheels([p.name for p in downloads.iterdir()], pinned)
    return {n: downloads / f for n, f in have.items()}


def gather_wheels(downloads: Path, vllm_wheel: Path | None, say) -> tuple[Path, dict[str, Path], dict[str, Path]]:
    """vLLM's wheel, its environment's pinned dependencies and epdbench's, downloaded where not there yet."""
    downloads.mkdir(parents=True, exist_ok=True)
    if vllm_wheel is None:
        vllm_wheel = downloads / pins.VLLM_WHEEL
        if not vllm_wheel.exists():
            say(f"downloading vllm=={pins.VLLM_VERSION} (about 300 MB) into {downloads} ...")
            pip_download([f"vllm=={pins.VLLM_VERSION}"], downloads)
    deps = pinned_wheels(downloads, pins.DEPENDENCY_PINS, "dependencies of vLLM's environment", say)
    epd = pinned_wheels(downloads, pins.EPDBENCH_DEPENDENCY_PINS, "dependencies of epdbench's environment", say)
    return vllm_wheel, deps, epd


def deb_file_name(pool_path: str) -> str:
    return unquote(pool_path.rsplit("/", 1)[-1])


def fetch_debs(downloads: Path, debs: dict[str, tuple[str, str, str]], say, mirror: str | None = None) -> dict:
    """{package: path} of the pinned Debian packages, downloaded from the mirror where not there yet; each file's
    sha256 must be the pin's (a cached file that is not is fetched again)."""
    folder = downloads / "debs"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for package, (_version, pool_path, sha256) in debs.items():
        path = folder / deb_file_name(pool_path)
        if not (path.exists() and sha256_file(path) == sha256):
            url = (mirror or pins.DEBIAN_MIRROR) + pool_path
            say(f"downloading {package} from {url} ...")
            try:
                with urllib.request.urlopen(url, timeout=60) as r, open(path.with_suffix(".part"), "wb") as fh:
                    shutil.copyfileobj(r, fh, CHUNK)
            except (urllib.error.URLError, OSError) as e:
                raise WheelhouseError(f"{package}: cannot download {url} ({e}); a Debian point release may have "
                                      "replaced that version: update SYSTEM_DEBS in wheelhouse_pins.py") from None
            path.with_suffix(".part").rename(path)
            if sha256_file(path) != sha256:
                path.unlink()
                raise WheelhouseError(f"{package}: {url} is not the pinned file (sha256 differs); update SYSTEM_DEBS")
        out[package] = path
    return out


def checkout_root() -> Path:
    """The checkout epdbench runs from (its pyproject.toml names the project); WheelhouseError for an install."""
    import epdbench
    root = Path(epdbench.__file__).resolve().parents[1]
    project = root / "pyproject.toml"
    if not project.is_file() or 'name = "epdbench"' not in project.read_text():
        raise WheelhouseError(f"epdbench runs from {root}, not a checkout: build the bundle from a checkout "
                              "(pip install -e .), whose epdbench the bundle carries")
    return root


def build_epdbench_wheel(dest: Path, root: Path | None = None) -> Path:
    """epdbench's wheel from a clean copy of the checkout's package folders (no stale build/ tree can leak into
    it): `pip wheel --no-deps --no-build-isolation`, with this interpreter's setuptools."""
    root = root or checkout_root()
    with tempfile.TemporaryDirectory(prefix="epdbench-src-") as tmp:
        for item in SOURCE_ITEMS:
            src = root / item
            if src.is_dir():
                shutil.copytree(src, Path(tmp) / item, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif src.is_file():
                shutil.copy2(src, Path(tmp) / item)
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
               "--no-build-isolation", "-w", str(dest), tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["?"]
        raise WheelhouseError(f"pip wheel of epdbench failed: {lines[-1][:300]}")
    built = [p for p in dest.glob("epdbench-*.whl") if wheel_identity(p.name)[0] == "epdbench"]
    if len(built) != 1:
        raise WheelhouseError(f"pip wheel of epdbench made {len(built)} wheels in {dest}")
    return built[0]
