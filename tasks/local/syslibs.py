"""System libraries the offline GPU bundle carries for Mooncake's transfer engine (its engine.so NEEDS libibverbs,
libmlx5, libnuma and libcurl, which a host image may lack), as Debian packages: read them, decide which the host
lacks, and load those before `mooncake` is imported.

Standard library only: the build imports it as epdbench.tasks.local.syslibs; install.sh, which runs with the host's
bare python3, imports the copy the bundle's tar carries; and that copy, installed into vLLM's environment as
_epdbench_syslibs, arms the import hook there (a .pth calls arm()). The functions that read bytes or text and decide
are pure; only arm() and the hook it installs touch the process."""
from __future__ import annotations

import io
import os
import struct
import sys
import tarfile

MODULE = "_epdbench_syslibs"                 # its name inside vLLM's environment
PLAN_FILE = "epdbench-syslibs.json"          # in the environment's folder: what to load, in order
TRIGGERS = ("mooncake",)                     # the top-level packages whose import loads the libraries first
# Sonames of glibc, always on a host that runs Python: never carried, never looked up.
GLIBC = frozenset({"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libresolv.so.2",
                   "ld-linux-x86-64.so.2", "libutil.so.1", "libanl.so.1"})


class SyslibsError(ValueError):
    """A package or library that cannot be read or placed; the message is one line."""


# ---- reading Debian packages and ELF files -----------------------------------------------------------------------

def ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an `ar` archive (a .deb is one: debian-binary, control.tar.*, data.tar.*)."""
    if not data.startswith(b"!<arch>\n"):
        raise SyslibsError("not an ar archive (a .deb starts with !<arch>)")
    members, at = {}, 8
    while at + 60 <= len(data):
        header = data[at:at + 60]
        name, size = header[:16].decode("ascii").strip().rstrip("/"), int(header[48:58].decode("ascii").strip())
        members[name] = data[at + 60:at + 60 + size]
        at += 60 + size + (size % 2)
    return members


def deb_data(deb: bytes) -> tarfile.TarFile:
    """The data tar of a .deb (xz, gzip, bzip2 or plain), opened for reading."""
    members = ar_members(deb)
    name = next((n for n in members if n.startswith("data.tar")), None)
    if name is None:
        raise SyslibsError("a .deb without a data.tar member")
    if name.endswith(".zst"):
        raise SyslibsError(f"{name}: zstd-compressed; carry a package of a release that uses xz (Debian)")
    return tarfile.open(fileobj=io.BytesIO(members[name]), mode="r:*")


def elf_dynamic(data: bytes) -> tuple[str | None, list[str]]:
    """(SONAME, [NEEDED ...]) of a 64-bit little-endian ELF file's dynamic section; (None, []) for one without."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SyslibsError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynamic = next((s for s in sections if s[1] == 6), None)              # SHT_DYNAMIC
    if dynamic is None:
        return None, []
    strtab = sections[dynamic[6]]                                         # sh_link: its string table
    soname, needed = None, []
    for off in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, value = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag in (1, 14):                                                # DT_NEEDED, DT_SONAME
            start = strtab[4] + value
            text = data[start:data.index(b"\0", start)].decode()
            if tag == 1:
                needed.append(text)
            else:
                soname = text
    return soname, needed


def deb_libraries(deb: bytes) -> list[dict]:
    """Every shared library of a .deb that has a SONAME: its path inside the package, soname and NEEDED list."""
    libs = []
    with deb_data(deb) as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if not member.isfile() or ".so" not in os.path.basename(name):
                continue
            data = tar.extractfile(member).read()
            if data[:4] != b"\x7fELF":
                continue
            soname, needed = elf_dynamic(data)
            if soname:
                libs.append({"path": name, "soname": soname, "needed": needed})
    return sorted(libs, key=lambda lib: lib["path"])


# ---- what the host has, and what to load -------------------------------------------------------------------------

def host_sonames(ldconfig_p: str) -> set[str]:
    """The x86-64 sonames in `ldconfig -p`'s cache listing ("\tlibz.so.1 (libc6,x86-64) => /lib/.../libz.so.1")."""
    found = set()
    for line in ldconfig_p.splitlines():
        name, _, rest = line.strip().partition(" (")
        if rest and "x86-64" in rest.partition(")")[0]:
            found.add(name)
    return found


def preload_plan(libs: dict[str, dict], roots, host: set[str], base) -> tuple[list[str], list[str]]:
    """(sonames to load, dependencies first; problems) for `roots` on a host whose cache holds `host`. A soname the
    host has is left to the dynamic loader (and so are its dependencies); one it lacks is loaded from the carried
    `libs` (soname -> {path, needed, ...}) after what it needs; `base` (glibc's and what the host's Python links) is
    assumed present. A soname neither on the host, in `base` nor carried is a problem."""
    order, problems, state = [], [], {}
    present = set(host) | set(base) | GLIBC

    def visit(soname: str, by: str) -> None:
        if soname in present or state.get(soname) == "done":
            return
        if soname not in libs:
            problems.append(f"{soname} (needed by {by}) is neither on this host nor carried")
            return
        if state.get(soname) == "visiting":            # a cycle: already on the way, loaded once
            return
        state[soname] = "visiting"
        for dep in libs[soname]["needed"]:
            visit(dep, soname)
        state[soname] = "done"
        order.append(soname)

    for root in roots:
        visit(root, "the transfer engine")
    return order, problems


def carried_problems(packages: list[dict], roots, base) -> list[str]:
    """What makes the carried packages wrong for `roots` on a host that has only `base`: a soname they reach that
    nothing carries, or a package none of whose libraries is reached."""
    libs = {lib["soname"]: {**lib, "package": p["package"]} for p in packages for lib in p["libs"]}
    order, problems = preload_plan(libs, roots, set(), base)
    used = {libs[s]["package"] for s in order}
    return problems + [f"{p['package']} is carried but no library the transfer engine needs is in it"
                       for p in packages if p["package"] not in used]


def packages_to_unpack(libs: dict[str, dict], order: list[str]) -> list[str]:
    """The carried packages that hold the libraries to load, in the order of their first library."""
    return list(dict.fromkeys(libs[s]["package"] for s in order))


def extract_libraries(deb: bytes, paths, dest: str) -> list[str]:
    """Write the package's files `paths` (and its copyright) under `dest`; their paths there."""
    wanted, written = set(paths), []
    with deb_data(deb) as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if member.isfile() and (name in wanted or name.endswith("/copyright")):
                target = os.path.join(dest, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as out:
                    out.write(src.read())
                os.chmod(target, 0o755 if name in wanted else 0o644)
                if name in wanted:
                    written.append(target)
    missing = wanted - {os.path.relpath(p, dest) for p in written}
    if missing:
        raise SyslibsError(f"the package lacks {sorted(missing)[0]}")
    return written


# ---- inside vLLM's environment -------------------------------------------------------------------------------------

class PreloadFinder:
    """A meta-path finder that finds nothing: the first time a TRIGGERS package is looked up it loads the libraries
    (by path, RTLD_GLOBAL), so that the extension's NEEDED sonames resolve to them without LD_LIBRARY_PATH."""

    def __init__(self, paths: list[str], triggers=TRIGGERS, load=None):
        self.paths, self.triggers, self.done, self.load = list(paths), tuple(triggers), False, load

    def find_spec(self, name, path=None, target=None):
        if self.done or name.partition(".")[0] not in self.triggers:
            return None
        self.done = True
        load = self.load or _load_global
        for lib in self.paths:
            try:
                load(lib)
            except OSError as e:
                raise ImportError(f"epdbench bundle: cannot load {lib} before {name} ({e})") from None
        return None


def _load_global(path: str) -> None:
    import ctypes
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def arm(prefix: str | None = None) -> PreloadFinder | None:
    """Install the finder for the environment at `prefix` (default: this interpreter's) when its plan lists
    libraries; called by the environment's .pth at every start, so it costs one small file read."""
    import json
    try:
        with open(os.path.join(prefix or sys.prefix, PLAN_FILE)) as fh:
            plan = json.load(fh)
        paths, triggers = plan["load"], plan.get("triggers") or TRIGGERS
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not paths:
        return None
    finder = PreloadFinder(paths, triggers)
    sys.meta_path.insert(0, finder)
    return finder
