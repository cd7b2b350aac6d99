"""Small real wheels made in a test's folder: METADATA with Requires-Dist, WHEEL, a RECORD with every file's hash,
so that pip installs them (offline) as it would the bundle's."""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def record_row(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes] | None = None,
               requires: list[str] = (), tag: str = "py3-none-any") -> Path:
    """`folder`/NAME-VERSION-TAG.whl holding `files` (default: NAME/__init__.py with __version__)."""
    dist = name.replace("-", "_")
    files = dict(files or {f"{dist}/__init__.py": f"__version__ = {version!r}\n".encode()})
    info = f"{dist}-{version}.dist-info"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])
    files[f"{info}/METADATA"] = meta.encode()
    files[f"{info}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
    record = "".join(record_row(p, d) + "\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-{tag}.whl"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            z.writestr(p, d)
        z.writestr(f"{info}/RECORD", record)
    return path
