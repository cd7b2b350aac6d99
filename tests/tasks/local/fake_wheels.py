"""Small real wheels made in a test's folder: METADATA with Requires-Dist, WHEEL, a RECORD with every file's hash,
so that pip installs them (offline) as it would the bundle's; small Debian packages (ar, data.tar.xz) the same way;
and small shared libraries compiled here (cc), for the system libraries' hook."""
from __future__ import annotations

import base64
import hashlib
import io
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path


def record_row(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes] | None = None,
               requires: list[str] = (), tag: str = "py3-none-any", scripts: dict[str, str] | None = None) -> Path:
    """`folder`/NAME-VERSION-TAG.whl holding `files` (default: NAME/__init__.py with __version__) and console
    `scripts` ({name: "module:function"})."""
    dist = name.replace("-", "_")
    files = dict(files or {f"{dist}/__init__.py": f"__version__ = {version!r}\n".encode()})
    info = f"{dist}-{version}.dist-info"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])
    files[f"{info}/METADATA"] = meta.encode()
    files[f"{info}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
    if scripts:
        files[f"{info}/entry_points.txt"] = ("[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items())).encode()
    record = "".join(record_row(p, d) + "\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-{tag}.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            z.writestr(p, d)
        z.writestr(f"{info}/RECORD", record)
    return path


def _ar_member(name: str, data: bytes) -> bytes:
    header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
    return header + data + (b"\n" if len(data) % 2 else b"")


def make_deb(folder: Path, package: str, version: str, files: dict[str, bytes]) -> Path:
    """`folder`/PACKAGE_VERSION_amd64.deb whose data.tar.xz holds `files` (paths like usr/lib/x86_64-linux-gnu/x)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for path, content in files.items():
            info = tarfile.TarInfo("./" + path)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    control = io.BytesIO()
    with tarfile.open(fileobj=control, mode="w:xz") as tar:
        text = f"Package: {package}\nVersion: {version}\nArchitecture: amd64\n".encode()
        info = tarfile.TarInfo("./control")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package}_{version}_amd64.deb"
    path.write_bytes(b"!<arch>\n" + _ar_member("debian-binary", b"2.0\n")
                     + _ar_member("control.tar.xz", control.getvalue()) + _ar_member("data.tar.xz", data.getvalue()))
    return path


def compile_library(folder: Path, soname: str, source: str, link: list[Path] = ()) -> Path:
    """A shared library `folder`/SONAME compiled from C `source`, NEEDING each of `link` (by its soname)."""
    if shutil.which("cc") is None:
        import pytest
        pytest.skip("no C compiler (cc) to make a shared library")
    folder.mkdir(parents=True, exist_ok=True)
    c = folder / f"{soname}.c"
    c.write_text(source)
    out = folder / soname
    cmd = ["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(c),
           *(f"-L{lib.parent}" for lib in link), *(f"-l:{lib.name}" for lib in link)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out
