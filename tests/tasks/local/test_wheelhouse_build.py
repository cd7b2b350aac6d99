"""tasks/local/wheelhouse_build.py and install.sh on small wheels, Debian packages and libraries made here: the
bundle is built without network, its parts join back from any folder, install.sh refuses a missing or corrupt part
in one line, installs vLLM's and epdbench's environments side by side into venvs of the host's Python with
--no-index --no-deps, unpacks the transfer engine's system library the host lacks and loads it before `mooncake`
is imported, and run again only checks."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from epdbench.cli import main
from epdbench.tasks.local import syslibs
from epdbench.tasks.local import wheelhouse_build as build
from epdbench.tasks.local import wheelhouse_fetch as fetch
from epdbench.tasks.local import wheelhouse_pins as pins
from epdbench.tasks.local.wheelhouse import WheelhouseError
from tests.tasks.local.fake_wheels import compile_library, make_deb, make_wheel

HERE_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
BIG = os.urandom(3 * 2**19)        # 1.5 MiB that does not compress: two parts of 1 MiB
# The fake transfer engine: an extension-like library that NEEDS libepdfake.so.1, which no host has.
ENGINE_PY = (b"import ctypes, os\n"
             b"probe = ctypes.CDLL(os.path.join(os.path.dirname(__file__), 'engine_native.so')).probe\n")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Pins and downloads of a small bundle: vllm 1.0 (two files trimmed), dep-a, fastish 1.0, nixl, nixl-cu13 and
    a mooncake whose native part NEEDS libepdfake.so.1 (a Debian package on a file:// mirror); epdbench 0.1.0 (its
    console script `epdbench`) with dep-a (shared), dep-b, fastish 2.0 and tok-extra through its local extra."""
    downloads, cc = tmp_path / "downloads", tmp_path / "cc"
    fakelib = compile_library(cc, "libepdfake.so.1", "int epd_fake(void){return 42;}")
    native = compile_library(cc, "engine_native.so", "extern int epd_fake(void); int probe(void){return epd_fake();}",
                             [fakelib])
    make_wheel(downloads, "vllm", "1.0", {"vllm/__init__.py": b"__version__ = '1.0'\n", "vllm/_C.so": BIG,
                                          "vllm/big.so": b"\0" * 5000, "vllm/kern/a.py": b"x = 1\n"},
               requires=["dep-a>=2", "heavy-kernels", "pytest", "fastish==1.0"])
    for name, version in (("dep-a", "2.1"), ("fastish", "1.0"), ("fastish", "2.0"), ("dep-b", "1.0"),
                          ("tok-extra", "1.0")):
        make_wheel(downloads, name, version)
    make_wheel(downloads, "nixl", "1.5.1", requires=["nixl-cu12==1.5.1", "nixl-cu13==1.5.1"])
    make_wheel(downloads, "nixl-cu13", "1.5.1", {"nixl_cu13/__init__.py": b"", "nixl_cu13/ep/x.so": b"\1" * 300},
               requires=["pytest"])
    make_wheel(downloads, "mooncake-fake", "0.3", {"mooncake/__init__.py": b"", "mooncake/engine.py": ENGINE_PY,
                                                   "mooncake/engine_native.so": native.read_bytes(),
                                                   "mooncake/store.so": b"\0" * 100}, requires=["pytest"])
    deb = make_deb(tmp_path / "mirror" / "pool", "libepdfake1", "1.0", {
        "usr/lib/x86_64-linux-gnu/libepdfake.so.1.0": fakelib.read_bytes(),
        "usr/share/doc/libepdfake1/copyright": b"made by a test"})
    epd = make_wheel(tmp_path / "epd", "epdbench", "0.1.0", {
        "epdbench_fake/__init__.py": b"", "epdbench_fake/cli.py": b"def main():\n    print('usage: epdbench')\n"},
        requires=["dep-a", "dep-b", "fastish==2.0", "stray-router", "pytest", 'tok-extra; extra == "local"'],
        scripts={"epdbench": "epdbench_fake.cli:main"})
    for name, value in {"VLLM_VERSION": "1.0", "VLLM_WHEEL": "vllm-1.0-py3-none-any.whl",
                        "VLLM_ROOTS": ("vllm", "nixl", "mooncake-fake"),
                        "TRIMS": {"vllm": {"vllm/big.so": "never loaded", "vllm/kern/": "another chip's"},
                                  "nixl-cu13": {"nixl_cu13/ep/": "other torch"},
                                  "mooncake-fake": {"mooncake/store.so": "the store, unused"}},
                        "DROPPED": {"heavy-kernels": "not on this path", "nixl-cu12": "CUDA 13 host"},
                        "IMAGE_PACKAGES": ("pytest",), "IMAGE_VERSIONS": {}, "IMAGE_NOTES": {},
                        "DEPENDENCY_PINS": {"dep-a": "2.1", "fastish": "1.0", "nixl": "1.5.1", "nixl-cu13": "1.5.1",
                                            "mooncake-fake": "0.3"},
                        "IMPORT_CHECK": ("vllm", "dep_a", "nixl", "mooncake.engine"), "TARGET_PYTHON": HERE_PYTHON,
                        "ENGINE_ENV": {"EPDBENCH_TEST_SAMPLER": "0"},
                        "EPDBENCH_DEPENDENCY_PINS": {"dep-a": "2.1", "dep-b": "1.0", "fastish": "2.0",
                                                     "tok-extra": "1.0"},
                        "EPDBENCH_EXTRAS": ("local",), "EPDBENCH_DROPPED": {"stray-router": "its binary is unused"},
                        "EPDBENCH_IMPORT_CHECK": ("epdbench_fake.cli", "dep_b", "fastish"),
                        "SYSTEM_LIBS_WHEEL": "mooncake-fake", "SYSTEM_LIB_ROOTS": ("libepdfake.so.1",),
                        "SYSTEM_HOST_BASE": {}, "DEBIAN_MIRROR": f"file://{tmp_path / 'mirror'}/",
                        "SYSTEM_DEBS": {"libepdfake1": ("1.0", f"pool/{deb.name}",
                                                        hashlib.sha256(deb.read_bytes()).hexdigest())}}.items():
        monkeypatch.setattr(pins, name, value)

    def no_network(requirements, dest):
        raise AssertionError(f"a test downloaded {requirements}")
    monkeypatch.setattr(fetch, "pip_download", no_network)
    monkeypatch.setattr(fetch, "build_epdbench_wheel", lambda dest, root=None: Path(shutil.copy2(epd, dest)))
    return downloads


def built(tmp_path, downloads) -> tuple[Path, dict]:
    out = tmp_path / "bundle"
    return out, build.build_bundle(out, downloads, part_mib=1, say=lambda line: None)


def record_of(wheel: Path) -> tuple[dict, set]:
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        rows = {r[0]: r for r in csv.reader(io.StringIO(z.read(record).decode()))}
        digests = {n: "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(z.read(n)).digest()).rstrip(b"=").decode()
                   for n in z.namelist()}
    return rows, digests


def test_the_bundle_is_parts_of_one_tar_with_a_trimmed_vllm_whose_record_names_exactly_its_files(tmp_path, fake):
    out, manifest = built(tmp_path, fake)
    parts = manifest["parts"]
    assert [p["file"] for p in parts] == [f"{build.STEM}.tar.001", f"{build.STEM}.tar.002"]
    assert all(p["bytes"] <= 2**20 for p in parts) and sorted(os.listdir(out)) == sorted(
        [p["file"] for p in parts] + ["manifest.json", "install.sh"])
    joined = b"".join((out / p["file"]).read_bytes() for p in parts)
    assert hashlib.sha256(joined).hexdigest() == manifest["tar"]["sha256"]
    assert [(w["name"], w["version"], w["envs"], w["required_by"]) for w in manifest["wheels"]] == [
        ("dep-a", "2.1", ["vllm", "epdbench"], ["epdbench 0.1.0", "vllm 1.0"]),      # one file for both
        ("dep-b", "1.0", ["epdbench"], ["epdbench 0.1.0"]),
        ("epdbench", "0.1.0", ["epdbench"], []),
        ("fastish", "1.0", ["vllm"], ["vllm 1.0"]), ("fastish", "2.0", ["epdbench"], ["epdbench 0.1.0"]),
        ("mooncake-fake", "0.3", ["vllm"], []), ("nixl", "1.5.1", ["vllm"], []),
        ("nixl-cu13", "1.5.1", ["vllm"], ["nixl 1.5.1"]),
        ("tok-extra", "1.0", ["epdbench"], ["epdbench 0.1.0"]),                       # through the local extra
        ("vllm", "1.0", ["vllm"], [])]
    envs = manifest["environments"]
    assert envs["vllm"]["dropped"]["nixl-cu12"] == {"reason": "CUDA 13 host", "required_by": ["nixl 1.5.1"]}
    assert envs["epdbench"]["dropped"] == {"stray-router": {"reason": "its binary is unused",
                                                            "required_by": ["epdbench 0.1.0"]}}
    assert envs["epdbench"]["commands"] == [["epdbench", "--help"]] and envs["epdbench"]["extras"] == ["local"]
    assert (envs["vllm"]["default_venv"], envs["epdbench"]["default_venv"]) == (pins.DEFAULT_VENV,
                                                                                 pins.EPDBENCH_DEFAULT_VENV)
    assert {w: [(t["path"], t["files"], t["bytes"]) for t in rows] for w, rows in manifest["trimmed"].items()} == {
        "vllm": [("vllm/big.so", 1, 5000), ("vllm/kern/", 1, 6)], "nixl-cu13": [("nixl_cu13/ep/", 1, 300)],
        "mooncake-fake": [("mooncake/store.so", 1, 100)]}
    sl = manifest["system_libs"]
    assert (sl["env"], sl["roots"], sl["triggers"]) == ("vllm", ["libepdfake.so.1"], ["mooncake"])
    assert sl["packages"][0]["libs"] == [{"path": "usr/lib/x86_64-linux-gnu/libepdfake.so.1.0",
                                          "soname": "libepdfake.so.1", "needed": []}]
    unpacked = tmp_path / "unpacked"
    subprocess.run(["tar", "-xf", "-", "-C", str(unpacked.mkdir() or unpacked)], input=joined, check=True)
    assert (unpacked / build.TOOL).read_bytes() == Path(syslibs.__file__).read_bytes()
    assert [p.name for p in (unpacked / "debs").iterdir()] == ["libepdfake1_1.0_amd64.deb"]
    for wheel, gone in (("vllm-1.0-py3-none-any.whl", {"vllm/big.so", "vllm/kern/a.py"}),
                        ("nixl_cu13-1.5.1-py3-none-any.whl", {"nixl_cu13/ep/x.so"}),
                        ("mooncake_fake-0.3-py3-none-any.whl", {"mooncake/store.so"})):
        rows, digests = record_of(unpacked / "wheels" / wheel)
        assert set(rows) == set(digests) and not gone & set(rows)
        assert all(rows[n][1] == d for n, d in digests.items() if not n.endswith("RECORD"))
    assert os.access(out / "install.sh", os.X_OK)


def test_a_second_build_into_the_folder_replaces_the_first_and_a_foreign_folder_is_refused(tmp_path, fake):
    out, _ = built(tmp_path, fake)
    stale = json.loads((out / "manifest.json").read_text())
    stale["parts"].append({"file": "old-bundle.tar.009"})
    (out / "manifest.json").write_text(json.dumps(stale))
    (out / "old-bundle.tar.009").write_bytes(b"x")
    built(tmp_path, fake)
    assert not (out / "old-bundle.tar.009").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(WheelhouseError, match="not empty and holds no bundle"):
        build.build_bundle(tmp_path / "other", fake, part_mib=1, say=lambda line: None)


@pytest.mark.parametrize("pin, value, said", [
    ("DROPPED", {"nixl-cu12": "CUDA 13 host"},
     r"vLLM's environment's requirements: heavy-kernels \(required by vllm 1.0\) is neither carried"),
    ("EPDBENCH_DROPPED", {},
     r"epdbench's environment's requirements: stray-router \(required by epdbench 0.1.0\) is neither carried"),
    ("SYSTEM_LIB_ROOTS", ("libepdfake.so.1", "libnuma.so.1"),
     r"SYSTEM_DEBS do not close the transfer engine's libraries: libnuma.so.1 \(needed by the transfer engine\)"),
])
def test_pins_that_leave_a_requirement_uncovered_stop_the_build_before_writing(tmp_path, fake, monkeypatch, pin,
                                                                             value, said):
    monkeypatch.setattr(pins, pin, value)
    with pytest.raises(WheelhouseError, match=said):
        built(tmp_path, fake)
    assert not (tmp_path / "bundle").exists()


def test_the_engine_wheel_must_need_exactly_the_pinned_system_libraries(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(pins, "SYSTEM_HOST_BASE", {"libepdfake.so.1": "pretend the host has it"})
    monkeypatch.setattr(pins, "SYSTEM_LIB_ROOTS", ())
    monkeypatch.setattr(pins, "SYSTEM_DEBS", {})
    monkeypatch.setattr(pins, "SYSTEM_HOST_BASE", {})
    with pytest.raises(WheelhouseError, match=r"mooncake-fake's kept libraries need libepdfake.so.1 from the host; "
                                              r"SYSTEM_LIB_ROOTS says : update it"):
        built(tmp_path, fake)


def install(folder: Path, venv: Path, cwd: Path, epd_venv: Path | None = None) -> subprocess.CompletedProcess:
    epd_venv = epd_venv or venv.with_name(venv.name + "-epdbench")
    return subprocess.run(["bash", str(folder / "install.sh"), "--python", sys.executable, "--venv", str(venv),
                           "--epdbench-venv", str(epd_venv)],
                          cwd=cwd, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)


def run_in(python: Path, code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "EPDBENCH_TEST_SAMPLER"}
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, env={**clean, **env},
                          cwd=python.parent)


def test_install_sh_takes_parts_in_batches_refuses_a_bad_one_and_installs_both_environments(tmp_path, fake):
    out, manifest = built(tmp_path, fake)
    host = tmp_path / "on-the-host"          # another folder, run from yet another
    host.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    venv, epd = tmp_path / "env", tmp_path / "epd-env"
    first, second = (p["file"] for p in manifest["parts"])
    for name in ("install.sh", "manifest.json", first):
        shutil.copy2(out / name, host / name)

    done = install(host, venv, elsewhere, epd)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"error: part 2 of 2 ({second}) is not in {host} yet (1 of 2 missing): copy it there and run install.sh "
        "again")
    (host / second).write_bytes((out / second).read_bytes()[:100])
    done = install(host, venv, elsewhere, epd)
    assert done.returncode == 2 and "is 100 bytes, the manifest says" in done.stderr
    corrupt = bytearray((out / second).read_bytes())
    corrupt[7] ^= 0xFF
    (host / second).write_bytes(bytes(corrupt))
    done = install(host, venv, elsewhere, epd)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        f"error: part 2 of 2 ({second}) is corrupt (its sha256 is not the manifest's): copy it again and run "
        "install.sh again")
    assert not venv.exists() and not epd.exists() and not list(tmp_path.glob(".epdbench-bundle-*"))

    shutil.copy2(out / second, host / second)
    done = install(host, venv, elsewhere, epd)
    assert done.returncode == 0, done.stderr
    vpython, epdbench = venv / "bin" / "python", epd / "bin" / "epdbench"
    assert done.stdout.strip().splitlines()[-2:] == [str(vpython), str(epdbench)]
    assert "imports fine: vllm 1.0, nixl 1.5.1, mooncake-fake 0.3" in done.stderr
    assert "imports fine: epdbench 0.1.0" in done.stderr and "epdbench --help: fine" in done.stderr
    assert ("mooncake-fake's system libraries: the host has none of libepdfake.so.1; 1 loaded before mooncake from "
            "libepdfake1") in done.stderr
    # each environment has its own pins; the host's packages (this interpreter's venv) are seen through the bridge
    assert run_in(vpython, "import fastish, prefect; print(fastish.__file__)").stdout.strip().startswith(str(venv))
    assert "fastish-2.0" in " ".join(p.name for p in epd.rglob("fastish-*.dist-info"))
    assert not list(venv.rglob("dep_b")) and not list(epd.rglob("nixl"))
    assert subprocess.run([str(epdbench)], capture_output=True, text=True).stdout == "usage: epdbench\n"
    # the transfer engine's library: unpacked into vLLM's environment, loaded when mooncake is imported, not before
    plan = json.loads((venv / syslibs.PLAN_FILE).read_text())
    assert plan["load"] == [str(venv / "lib/epdbench-syslibs/libepdfake1/usr/lib/x86_64-linux-gnu/libepdfake.so.1.0")]
    assert (venv / "lib/epdbench-syslibs/libepdfake1/usr/share/doc/libepdfake1/copyright").exists()
    assert run_in(vpython, "import mooncake.engine; print(mooncake.engine.probe())").stdout.strip() == "42"
    loaded = "print(any('libepdfake' in line for line in open('/proc/self/maps')))"
    assert run_in(vpython, loaded).stdout.strip() == "False"
    assert run_in(epd / "bin" / "python", "import vllm").returncode != 0        # epdbench's has no vLLM
    # the manifest's engine_env is a default of every interpreter of vLLM's environment; a value already set wins
    show = "import os; print(os.environ.get('EPDBENCH_TEST_SAMPLER'))"
    assert run_in(vpython, show).stdout.strip() == "0"
    assert run_in(vpython, show, EPDBENCH_TEST_SAMPLER="1").stdout.strip() == "1"
    assert run_in(epd / "bin" / "python", show).stdout.strip() == "None"

    again = install(host, venv, elsewhere, epd)
    assert again.returncode == 0 and again.stderr.count("this bundle is installed; checking it") == 2
    assert again.stdout.strip().splitlines() == [str(vpython), str(epdbench)]
    shutil.rmtree(epd)                               # one environment gone: only that one is made again
    again = install(host, venv, elsewhere, epd)
    assert again.returncode == 0 and again.stderr.count("this bundle is installed; checking it") == 1
    assert f"making {epd} from" in again.stderr and f"making {venv} from" not in again.stderr


def test_install_sh_refuses_another_python_a_folder_that_is_no_venv_and_one_folder_for_both(tmp_path, fake,
                                                                                           monkeypatch):
    monkeypatch.setattr(pins, "TARGET_PYTHON", "3.99")
    out, _ = built(tmp_path, fake)
    done = install(out, tmp_path / "env", tmp_path)
    assert done.returncode == 2 and done.stderr.strip().endswith(
        "the bundle's wheels are for Python 3.99: give that one with --python PATH")
    monkeypatch.setattr(pins, "TARGET_PYTHON", HERE_PYTHON)
    out, _ = built(tmp_path, fake)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    done = install(out, tmp_path / "env", tmp_path, tmp_path / "home")
    assert done.returncode == 2 and done.stderr.strip().endswith(
        "exists and is not a Python environment; give another --epdbench-venv")
    assert (tmp_path / "home" / "notes.txt").read_text() == "mine"
    done = install(out, tmp_path / "env", tmp_path, tmp_path / "env")
    assert done.returncode == 2 and "both" in done.stderr and "give each its own folder" in done.stderr


@pytest.mark.parametrize("argv, said", [
    (["--wheelhouse", "w", "--part-mib", "0"], "error: --part-mib 0: 1 to 2047"),
    (["--wheelhouse", "w", "--vllm-wheel", "nope.whl"], "error: --vllm-wheel nope.whl: give the file "),
    (["--part-mib", "10"], "error: --part-mib: applies with --wheelhouse only"),
    (["--wheelhouse", "w", "--dir", "d"], "error: --dir: names the CPU environment"),
])
def test_engine_env_wheelhouse_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, said):
    monkeypatch.chdir(tmp_path)
    assert main(["engine-env", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(said)
    assert not (tmp_path / "w").exists()
