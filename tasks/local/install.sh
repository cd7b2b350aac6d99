#!/usr/bin/env bash
# Install the offline vLLM bundle that `epdbench engine-env --wheelhouse DIR` built, on a GPU host without network.
# Needs bash and the host's python3 only. Run it from anywhere; the parts and manifest.json lie beside this script
# (or in --from DIR). Parts may arrive in several batches: until all are there and whole, it names the first one
# missing or corrupt and changes nothing; run it again once they are.
#
#   bash install.sh [--python PATH] [--venv DIR] [--from DIR]
#     --python  the host's Python with torch (default: /opt/torch/.venv/bin/python3, else python3 on PATH)
#     --venv    where the environment goes (default: $EPDBENCH_VLLM_VENV, else ~/.cache/epdbench/vllm-gpu)
#     --from    the folder of the parts and manifest.json (default: this script's folder)
#
# It checks every part's sha256, joins them and checks the whole tar's, makes a venv with --system-site-packages
# from the host's Python (and, where that Python is itself a venv, a .pth that adds its site-packages: a venv made
# from a venv's python sees only the base interpreter's), installs the wheels with
# `pip install --no-index --no-deps`, checks the host's own packages against what the bundle's wheels require
# (warnings), sets the manifest's engine_env defaults for every interpreter of the venv (a .pth; e.g.
# VLLM_USE_FLASHINFER_SAMPLER=0, as FlashInfer is left out), imports vLLM, its OpenAI server, Qwen2.5-VL, the NIXL
# and EC connectors and NIXL, and prints the environment's python as its last line: give it to `epdbench compare --target local --vllm-python PATH`.
# Run again, a complete environment of the same bundle is only checked.
#
# Exit: 0 installed (or already); 2 bad input (a part missing or corrupt, manifest unreadable, --python not the
# bundle's Python, --venv not a venv folder); 3 the install or the import check failed (one line; the log named).
set -euo pipefail

usage() { sed -n '7,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
from="$here"
venv="${EPDBENCH_VLLM_VENV:-}"
python=""
while [ $# -gt 0 ]; do
    case "$1" in
        --python|--venv|--from)
            if [ $# -lt 2 ]; then echo "error: $1 needs a value (see --help)" >&2; exit 2; fi
            case "$1" in --python) python="$2" ;; --venv) venv="$2" ;; --from) from="$2" ;; esac
            shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$python" ]; then
    if [ -x /opt/torch/.venv/bin/python3 ]; then python=/opt/torch/.venv/bin/python3
    else python="$(command -v python3 || true)"; fi
fi
if [ -z "$python" ] || [ ! -x "$python" ]; then
    echo "error: no host Python at '${python:-python3}'; give the one with torch: --python PATH" >&2
    exit 2
fi

exec "$python" - "$from" "$venv" <<'PY'
import hashlib, importlib.util, json, os, shutil, site, subprocess, sys, sysconfig, tarfile, tempfile, time
from pathlib import Path

START = time.monotonic()
CHUNK = 1 << 20
MARKER = "epdbench-bundle.json"
src, venv_arg = Path(sys.argv[1]), sys.argv[2]


def fail(code, line):
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(code)


def say(line):
    print(line, file=sys.stderr, flush=True)


try:
    manifest = json.loads((src / "manifest.json").read_text())
    parts, tar_meta, target = manifest["parts"], manifest["tar"], manifest["target"]
except (OSError, ValueError, KeyError, TypeError) as e:
    fail(2, f"{src / 'manifest.json'}: unreadable ({type(e).__name__}); copy it again from the bundle's folder")
venv = Path(os.path.expanduser(venv_arg or target["default_venv"])).absolute()
vpython = venv / "bin" / "python"
want = tuple(int(x) for x in target["python"].split("."))
if sys.version_info[:2] != want:
    fail(2, f"{sys.executable} is Python {sys.version.split()[0]}; the bundle's wheels are for Python "
            f"{target['python']}: give that one with --python PATH")


def check_environment():
    """The host packages the wheels require (warnings), then the imports; a failed import ends with exit 3."""
    report = subprocess.run([str(vpython), "-c", CHECK, json.dumps(manifest["from_image"]),
                             json.dumps(manifest["import_check"]), json.dumps(manifest.get("engine_env") or {})],
                            capture_output=True, text=True,
                            stdin=subprocess.DEVNULL)
    for line in report.stderr.splitlines():
        if line.startswith("warning: "):
            say(line)
    if report.returncode != 0:
        last = (report.stdout.strip().splitlines() or report.stderr.strip().splitlines() or ["(no output)"])[-1]
        fail(3, f"import check in {venv} failed: {last[:400]}")
    say((report.stdout.strip().splitlines() or ["(no output)"])[-1])    # vLLM logs to stdout before it


CHECK = r'''
import importlib, importlib.metadata as md, json, sys
try:
    from packaging.specifiers import SpecifierSet
except ImportError:
    SpecifierSet = None
for r in json.loads(sys.argv[1]):
    try:
        have = md.version(r["name"])
    except md.PackageNotFoundError:
        print(f"warning: {r['name']} (required by {r['by']}) is not in the host's Python", file=sys.stderr)
        continue
    if SpecifierSet and r["spec"] and not SpecifierSet(r["spec"]).contains(have, prereleases=True):
        print(f"warning: the host's {r['name']} {have} is outside {r['by']}'s {r['name']}{r['spec']}"
              + (f" ({r['note']})" if r.get("note") else ""), file=sys.stderr)
for name in json.loads(sys.argv[2]):
    try:
        importlib.import_module(name)
    except BaseException as e:
        print(f"import {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        sys.exit(1)
import os
for key, want in json.loads(sys.argv[3]).items():
    if os.environ.get(key) is None:
        print(f"the environment's .pth did not set {key} (the manifest's engine_env)")
        sys.exit(1)
if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
    try:   # what the engine's sampler asks when it is built: with a dropped FlashInfer it must answer, not import
        from vllm.v1.sample.ops.topk_topp_sampler import flashinfer_sampler_supported
        flashinfer_sampler_supported()
    except ImportError as e:
        print(f"vLLM's sampler check: {type(e).__name__}: {e}")
        sys.exit(1)
seen = []
for dist in ("vllm", "nixl", "torch"):
    try:
        seen.append(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        pass
if "torch" in sys.modules:
    import torch
    seen.append(f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPUs visible")
print("imports fine: " + ", ".join(seen))
'''


def installed_here():
    try:
        done = json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return done.get("tar_sha256") == tar_meta["sha256"] and vpython.exists()


if installed_here():
    say(f"{venv}: this bundle is installed; checking it")
    check_environment()
    print(vpython)
    sys.exit(0)

# Every part there, with its size, before reading any: a batch still on its way is named, nothing changes.
n = len(parts)
missing = [i for i, p in enumerate(parts) if not (src / p["file"]).is_file()]
if missing:
    first = parts[missing[0]]["file"]
    fail(2, f"part {missing[0] + 1} of {n} ({first}) is not in {src} yet ({len(missing)} of {n} missing): copy it "
            "there and run install.sh again")
for i, p in enumerate(parts):
    size = (src / p["file"]).stat().st_size
    if size != p["bytes"]:
        fail(2, f"part {i + 1} of {n} ({p['file']}) is {size} bytes, the manifest says {p['bytes']}: still copying, "
                "or cut short; copy it again")
if venv.exists() and not (venv / "pyvenv.cfg").exists() and any(venv.iterdir()):
    fail(2, f"{venv} exists and is not a Python environment; give another --venv")

venv.parent.mkdir(parents=True, exist_ok=True)
work = Path(tempfile.mkdtemp(prefix=".epdbench-bundle-", dir=venv.parent))
log = venv.parent / f"{venv.name}.install.log"
try:
    say(f"joining {n} parts from {src} and checking them ...")
    tar_path, whole = work / tar_meta["file"], hashlib.sha256()
    with open(tar_path, "wb") as out:
        for i, p in enumerate(parts):
            h = hashlib.sha256()
            with open(src / p["file"], "rb") as fh:
                while block := fh.read(CHUNK):
                    h.update(block)
                    whole.update(block)
                    out.write(block)
            if h.hexdigest() != p["sha256"]:
                fail(2, f"part {i + 1} of {n} ({p['file']}) is corrupt (its sha256 is not the manifest's): copy it "
                        "again and run install.sh again")
    if whole.hexdigest() != tar_meta["sha256"]:
        fail(2, f"the joined parts are not the bundle's tar (sha256 differs) although each part is whole: the parts "
                "come from different builds; copy one build's parts and manifest.json")
    with tarfile.open(tar_path) as tar:
        tar.extractall(work, filter="data")
    tar_path.unlink()
    wheels = [str(work / "wheels" / w["file"]) for w in manifest["wheels"]]
    if venv.exists():
        say(f"{venv}: an environment of another bundle or an unfinished install; making it again")
        shutil.rmtree(venv)
    say(f"making {venv} from {sys.executable} and installing {len(wheels)} wheels (log: {log}) ...")
    with open(log, "w") as fh:
        steps = [[sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                 [sys.executable, "-m", "pip", "--python", str(vpython), "install", "--no-index", "--no-deps",
                  "--disable-pip-version-check", "--no-warn-script-location", *wheels]]
        if importlib.util.find_spec("pip") is None:
            fail(3, f"{sys.executable} has no pip to install the wheels with")
        for cmd in steps:
            fh.write("$ " + " ".join(cmd[:8]) + " ...\n")
            fh.flush()
            if subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode:
                lines = [x for x in log.read_text().splitlines() if x.strip()]
                fail(3, f"{cmd[2] if cmd[2] != '-m' else ' '.join(cmd[2:4])} failed: {(lines or ['?'])[-1][:300]} "
                        f"(log: {log})")
    purelib = subprocess.run([str(vpython), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if sys.prefix != sys.base_prefix:   # the host's Python is a venv: its packages are not "system" ones
        lines = [f"import site; site.addsitedir({d!r})" for d in site.getsitepackages() if Path(d).is_dir()]
        (Path(purelib) / "_epdbench_host_site.pth").write_text("\n".join(lines) + "\n")
    engine_env = manifest.get("engine_env") or {}
    if engine_env:   # what lets vLLM run without a dropped package, for every interpreter of the environment
        (Path(purelib) / "_epdbench_engine_env.pth").write_text(
            "".join(f"import os; os.environ.setdefault({k!r}, {v!r})\n" for k, v in sorted(engine_env.items())))
    check_environment()
    (venv / MARKER).write_text(json.dumps({"bundle": manifest["bundle"], "tar_sha256": tar_meta["sha256"],
                                           "vllm": manifest["pins"]["vllm"], "host_python": sys.executable,
                                           "installed_s": round(time.monotonic() - START, 1)}) + "\n")
    say(f"installed in {time.monotonic() - START:.0f}s")
finally:
    shutil.rmtree(work, ignore_errors=True)
print(vpython)
PY
