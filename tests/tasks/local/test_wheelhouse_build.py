"""tasks/local/wheelhouse_build.py and install.sh on small wheels made here: the bundle is built without network,
its parts join back from any folder, install.sh refuses a missing or corrupt part in one line, installs into a venv
of the host's Python with --no-index --no-deps, and run again only checks."""
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
import zipfile
from pathlib import Path

import pytest

from epdbench.cli import main
from epdbench.tasks.local import wheelhouse_build as build
from epdbench.tasks.local import wheelhouse_pins as pins
from epdbench.tasks.local.wheelhouse import WheelhouseError
from tests.tasks.local.fake_wheels import make_wheel

HERE_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
BIG = os.urandom(3 * 2**19)        # 1.5 MiB that does not compress: two parts of 1 MiB


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Pins and downloads of a small vLLM-like bundle: vllm 1.0 (two files trimmed), dep-a, nixl and nixl-cu13."""
    downloads = tmp_path / "downloads"
    make_wheel(downloads, "vllm", "1.0", {"vllm/__init__.py": b"__version__ = '1.0'\n", "vllm/_C.so": BIG,
                                          "vllm/big.so": b"\0" * 5000, "vllm/kern/a.py": b"x = 1\n"},
               requires=["dep-a>=2", "heavy-kernels", "pytest"])
    make_wheel(downloads, "dep-a", "2.1")
    make_wheel(downloads, "nixl", "1.5.1", requires=["nixl-cu12==1.5.1", "nixl-cu13==1.5.1"])
    make_wheel(downloads, "nixl-cu13", "1.5.1", {"nixl_cu13/__init__.py": b"", "nixl_cu13/ep/x.so": b"\1" * 300},
               requires=["pytest"])
    for name, value in {"VLLM_VERSION": "1.0", "VLLM_WHEEL": "vllm-1.0-py3-none-any.whl",
                        "TRIMS": {"vllm": {"vllm/big.so": "never loaded", "vllm/kern/": "another chip's"},
                                  "nixl-cu13": {"nixl_cu13/ep/": "other torch"}},
                        "DROPPED": {"heavy-kernels": "not on this path", "nixl-cu12": "CUDA 13 host"},
                        "IMAGE_PACKAGES": ("pytest",), "IMAGE_VERSIONS": {}, "IMAGE_NOTES": {},
                        "DEPENDENCY_PINS": {"dep-a": "2.1", "nixl": "1.5.1", "nixl-cu13": "1.5.1"},
                        "IMPORT_CHECK": ("vllm", "dep_a", "nixl"), "TARGET_PYTHON": HERE_PYTHON,
                        "ENGINE_ENV": {"EPDBENCH_TEST_SAMPLER": "0"}}.items():
        monkeypatch.setattr(pins, name, value)

    def no_network(requirements, dest):
        raise AssertionError(f"a test downloaded {requirements}")
    monkeypatch.setattr(build, "pip_download", no_network)
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
    assert [(w["name"], w["required_by"]) for w in manifest["wheels"]] == [
        ("dep-a", ["vllm 1.0"]), ("nixl", []), ("nixl-cu13", ["nixl 1.5.1"]), ("vllm", [])]
    assert manifest["dropped"]["nixl-cu12"] == {"reason": "CUDA 13 host", "required_by": ["nixl 1.5.1"]}
    assert {w: [(t["path"], t["files"], t["bytes"]) for t in rows] for w, rows in manifest["trimmed"].items()} == {
        "vllm": [("vllm/big.so", 1, 5000), ("vllm/kern/", 1, 6)], "nixl-cu13": [("nixl_cu13/ep/", 1, 300)]}
    unpacked = tmp_path / "unpacked"
    subprocess.run(["tar", "-xf", "-", "-C", str(unpacked.mkdir() or unpacked)], input=joined, check=True)
    for wheel, gone in (("vllm-1.0-py3-none-any.whl", {"vllm/big.so", "vllm/kern/a.py"}),
                        ("nixl_cu13-1.5.1-py3-none-any.whl", {"nixl_cu13/ep/x.so"})):
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


def test_pins_that_leave_a_requirement_uncovered_stop_the_build_before_writing(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(pins, "DROPPED", {"nixl-cu12": "CUDA 13 host"})
    with pytest.raises(WheelhouseError, match=r"heavy-kernels \(required by vllm 1.0\) is neither carried"):
        built(tmp_path, fake)
    assert not (tmp_path / "bundle").exists()


def install(folder: Path, venv: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(folder / "install.sh"), "--python", sys.executable, "--venv", str(venv)],
                          cwd=cwd, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)


def test_install_sh_takes_parts_in_batches_refuses_a_bad_one_and_installs_once_all_are_whole(tmp_path, fake):
    out, manifest = built(tmp_path, fake)
    host = tmp_path / "on-the-host"          # another folder, run from yet another
    host.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    venv = tmp_path / "env"
    first, second = (p["file"] for p in manifest["parts"])
    for name in ("install.sh", "manifest.json", first):
        shutil.copy2(out / name, host / name)

    done = install(host, venv, elsewhere)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"error: part 2 of 2 ({second}) is not in {host} yet (1 of 2 missing): copy it there and run install.sh "
        "again")
    (host / second).write_bytes((out / second).read_bytes()[:100])
    done = install(host, venv, elsewhere)
    assert done.returncode == 2 and "is 100 bytes, the manifest says" in done.stderr
    corrupt = bytearray((out / second).read_bytes())
    corrupt[7] ^= 0xFF
    (host / second).write_bytes(bytes(corrupt))
    done = install(host, venv, elsewhere)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        f"error: part 2 of 2 ({second}) is corrupt (its sha256 is not the manifest's): copy it again and run "
        "install.sh again")
    assert not venv.exists() and not list(tmp_path.glob(".epdbench-bundle-*"))

    shutil.copy2(out / second, host / second)
    done = install(host, venv, elsewhere)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(venv / "bin" / "python")
    assert "imports fine: vllm 1.0, nixl 1.5.1" in done.stderr
    # the host's packages (this interpreter's venv) are seen through the bridge; the bundle's come first
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import prefect, vllm, dep_a; print(vllm.__file__)"],
                           capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(venv)
    # the manifest's engine_env is a default of every interpreter of the environment; a value already set wins
    assert manifest["engine_env"] == {"EPDBENCH_TEST_SAMPLER": "0"}
    show = [str(venv / "bin" / "python"), "-c", "import os; print(os.environ['EPDBENCH_TEST_SAMPLER'])"]
    env = {k: v for k, v in os.environ.items() if k != "EPDBENCH_TEST_SAMPLER"}
    assert subprocess.run(show, capture_output=True, text=True, env=env).stdout.strip() == "0"
    assert subprocess.run(show, capture_output=True, text=True,
                          env={**env, "EPDBENCH_TEST_SAMPLER": "1"}).stdout.strip() == "1"

    again = install(host, venv, elsewhere)
    assert again.returncode == 0 and "this bundle is installed; checking it" in again.stderr
    assert again.stdout.strip() == str(venv / "bin" / "python")


def test_install_sh_refuses_another_python_and_a_folder_that_is_no_venv(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(pins, "TARGET_PYTHON", "3.99")
    out, _ = built(tmp_path, fake)
    done = install(out, tmp_path / "env", tmp_path)
    assert done.returncode == 2 and done.stderr.strip().endswith(
        "the bundle's wheels are for Python 3.99: give that one with --python PATH")
    monkeypatch.setattr(pins, "TARGET_PYTHON", HERE_PYTHON)
    out, _ = built(tmp_path, fake)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    done = install(out, tmp_path / "home", tmp_path)
    assert done.returncode == 2 and "exists and is not a Python environment" in done.stderr
    assert (tmp_path / "home" / "notes.txt").read_text() == "mine"


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
