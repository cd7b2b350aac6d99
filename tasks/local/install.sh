#!/usr/bin/env bash
# Install the offline GPU bundle that `epdbench engine-env --wheelhouse DIR` built, on a GPU host without network:
# vLLM's environment and epdbench's, side by side. Needs bash and the host's python3 only. Run it from anywhere; the
# parts and manifest.json lie beside this script (or in --from DIR). Parts may arrive in several batches: until all
# are there and whole, it names the first one missing or corrupt and changes nothing; run it again once they are.
#
#   bash install.sh [--python PATH] [--venv DIR] [--epdbench-venv DIR] [--from DIR]
#     --python         the host's Python with torch (default: /opt/torch/.venv/bin/python3, else python3 on PATH)
#     --venv           vLLM's environment (default: $EPDBENCH_VLLM_VENV, else ~/.cache/epdbench/vllm-gpu)
#     --epdbench-venv  epdbench's environment (default: $EPDBENCH_VENV, else ~/.cache/epdbench/epdbench-gpu)
#     --from           the folder of the parts and manifest.json (default: this script's folder)
#
# It checks every part's sha256, joins them and checks the whole tar's. For each environment it makes a venv with
# --system-site-packages from the host's Python (and, where that Python is itself a venv, a .pth that adds its
# site-packages: a venv made from a venv's python sees only the base interpreter's), installs that environment's
# wheels with `pip install --no-index --no-deps`, checks the host's own packages against what its wheels require
# (warnings), and imports what the manifest names. In vLLM's: the manifest's engine_env defaults for every
# interpreter (a .pth; VLLM_USE_FLASHINFER_SAMPLER=0, as FlashInfer is left out), and the system libraries of
# Mooncake's transfer engine that the host's `ldconfig -p` lacks, unpacked from the bundle's Debian packages into
# VENV/lib/epdbench-syslibs and loaded by path before `mooncake` is imported (a .pth arms the hook; no
# LD_LIBRARY_PATH); it imports vLLM, its OpenAI server, Qwen2.5-VL, the NIXL, EC and Mooncake connectors, NIXL, torch
# and mooncake.engine. In epdbench's: it imports the CLI, the compare flow, MLflow and Prefect and runs
# `epdbench --help`. Its last two lines: vLLM's python, then epdbench's `epdbench`:
#   "$EPDBENCH" compare --target local --spec gpu-qwen25vl --vllm-python "$VLLM_PYTHON"
# Run again, a complete environment of the same bundle is only checked.
#
# Exit: 0 installed (or already); 2 bad input (a part missing or corrupt, manifest unreadable, --python not the
# bundle's Python, a venv folder that is not a venv, the same folder for both); 3 the install or a check failed (one
# line; the log named).
set -euo pipefail

usage() { sed -n '7,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
from="$here"
venv="${EPDBENCH_VLLM_VENV:-}"
epd_venv="${EPDBENCH_VENV:-}"
python=""
while [ $# -gt 0 ]; do
    case "$1" in
        --python|--venv|--epdbench-venv|--from)
            if [ $# -lt 2 ]; then echo "error: $1 needs a value (see --help)" >&2; exit 2; fi
            case "$1" in --python) python="$2" ;; --venv) venv="$2" ;; --epdbench-venv) epd_venv="$2" ;;
                         --from) from="$2" ;; esac
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

exec "$python" - "$from" "$venv" "$epd_venv" <<'PY'
import hashlib, importlib.util, json, os, shutil, site, subprocess, sys, tarfile, tempfile, time
from pathlib import Path

START = time.monotonic()
CHUNK = 1 << 20
MARKER = "epdbench-bundle.json"
ENVS = ("vllm", "epdbench")
src, args = Path(sys.argv[1]), dict(zip(ENVS, sys.argv[2:4]))


def fail(code, line):
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(code)


def say(line):
    print(line, file=sys.stderr, flush=True)


try:
    manifest = json.loads((src / "manifest.json").read_text())
    parts, tar_meta, target, envs = manifest["parts"], manifest["tar"], manifest["target"], manifest["environments"]
except (OSError, ValueError, KeyError, TypeError) as e:
    fail(2, f"{src / 'manifest.json'}: unreadable ({type(e).__name__}); copy it again from the bundle's folder "
            "(with the install.sh of the same build)")
venvs = {env: Path(os.path.expanduser(args[env] or envs[env]["default_venv"])).absolute() for env in ENVS}
if venvs["vllm"] == venvs["epdbench"]:
    fail(2, f"vLLM's and epdbench's environments are both {venvs['vllm']}: give each its own folder")
want = tuple(int(x) for x in target["python"].split("."))
if sys.version_info[:2] != want:
    fail(2, f"{sys.executable} is Python {sys.version.split()[0]}; the bundle's wheels are for Python "
            f"{target['python']}: give that one with --python PATH")


def python_of(env):
    return venvs[env] / "bin" / "python"


def check_environment(env):
    """The host packages the wheels require (warnings), the imports, then the commands; exit 3 on a failure."""
    spec, venv = envs[env], venvs[env]
    report = subprocess.run([str(python_of(env)), "-c", CHECK, json.dumps(spec["from_image"]),
                             json.dumps(spec["import_check"]), json.dumps(spec.get("engine_env") or {}),
                             json.dumps(spec["roots"])],
                            capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=venv)
    for line in report.stderr.splitlines():
        if line.startswith("warning: "):
            say(line)
    if report.returncode != 0:
        last = (report.stdout.strip().splitlines() or report.stderr.strip().splitlines() or ["(no output)"])[-1]
        fail(3, f"import check in {venv} failed: {last[:400]}")
    say((report.stdout.strip().splitlines() or ["(no output)"])[-1])    # vLLM logs to stdout before it
    for cmd in spec.get("commands") or []:
        done = subprocess.run([str(venv / "bin" / cmd[0]), *cmd[1:]], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, cwd=venv)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["(no output)"])[-1]
            fail(3, f"{' '.join(cmd)} in {venv} exited {done.returncode}: {last[:400]}")
        say(f"{' '.join(cmd)}: fine")


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
if "vllm" in sys.modules and "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
    try:   # what the engine's sampler asks when it is built: with a dropped FlashInfer it must answer, not import
        from vllm.v1.sample.ops.topk_topp_sampler import flashinfer_sampler_supported
        flashinfer_sampler_supported()
    except ImportError as e:
        print(f"vLLM's sampler check: {type(e).__name__}: {e}")
        sys.exit(1)
seen = []
for dist in json.loads(sys.argv[4]):
    try:
        seen.append(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        pass
if "torch" in sys.modules:
    import torch
    seen.append(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPUs visible")
print("imports fine: " + ", ".join(seen))
'''


def installed_here(env):
    try:
        done = json.loads((venvs[env] / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return done.get("tar_sha256") == tar_meta["sha256"] and python_of(env).exists()


def finish():
    """The contract other scripts read: the last two lines are vLLM's python and epdbench's `epdbench`."""
    print(python_of("vllm"))
    print(venvs["epdbench"] / "bin" / "epdbench")
    sys.exit(0)


pending = [env for env in ENVS if not installed_here(env)]
for env in ENVS:
    if env not in pending:
        say(f"{venvs[env]}: this bundle is installed; checking it")
        check_environment(env)
if not pending:
    finish()

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
for env in pending:
    venv = venvs[env]
    if venv.exists() and not (venv / "pyvenv.cfg").exists() and any(venv.iterdir()):
        flag = "--venv" if env == "vllm" else "--epdbench-venv"
        fail(2, f"{venv} exists and is not a Python environment; give another {flag}")
if importlib.util.find_spec("pip") is None:
    fail(3, f"{sys.executable} has no pip to install the wheels with")


def join_parts(work):
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


def place_system_libraries(work, venv, purelib):
    """Unpack the libraries of the transfer engine that the host lacks and arm the hook that loads them."""
    sl = manifest["system_libs"]
    sys.path.insert(0, str(work / Path(sl["tool"]).parent))
    import syslibs as tool                                # the bundle's copy of epdbench's tasks/local/syslibs.py
    libs = {lib["soname"]: {**lib, "package": p["package"]} for p in sl["packages"] for lib in p["libs"]}
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None)
    listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout if ldconfig else ""
    host = tool.host_sonames(listing)
    order, problems = tool.preload_plan(libs, sl["roots"], host, set(sl["host_base"]))
    if problems:
        fail(3, f"the transfer engine's libraries: {problems[0]}")
    packages = tool.packages_to_unpack(libs, order)
    by_package, dest = {p["package"]: p for p in sl["packages"]}, venv / "lib" / "epdbench-syslibs"
    for package in packages:
        tool.extract_libraries((work / "debs" / by_package[package]["file"]).read_bytes(),
                               [libs[s]["path"] for s in order if libs[s]["package"] == package], str(dest / package))
    load = [str(dest / libs[s]["package"] / libs[s]["path"]) for s in order]
    (venv / tool.PLAN_FILE).write_text(json.dumps({"load": load, "triggers": sl["triggers"], "packages": packages,
                                                   "host_has": sorted(set(sl["roots"]) & host)}, indent=1) + "\n")
    shutil.copyfile(work / sl["tool"], Path(purelib) / f"{tool.MODULE}.py")
    (Path(purelib) / f"{tool.MODULE}.pth").write_text(f"import {tool.MODULE}; {tool.MODULE}.arm()\n")
    has = ", ".join(sorted(set(sl["roots"]) & host)) or "none"
    say(f"{sl['wheel']}'s system libraries: the host has {has} of {', '.join(sl['roots'])}; "
        + (f"{len(load)} loaded before {', '.join(sl['triggers'])} from {', '.join(packages)}" if load
           else "nothing to load"))


def make_environment(env, work):
    venv, vpython = venvs[env], python_of(env)
    log = venv.parent / f"{venv.name}.install.log"
    wheels = [str(work / "wheels" / w["file"]) for w in manifest["wheels"] if env in w["envs"]]
    if venv.exists():
        say(f"{venv}: an environment of another bundle or an unfinished install; making it again")
        shutil.rmtree(venv)
    say(f"making {venv} from {sys.executable} and installing {len(wheels)} wheels (log: {log}) ...")
    with open(log, "w") as fh:
        steps = [[sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                 [sys.executable, "-m", "pip", "--python", str(vpython), "install", "--no-index", "--no-deps",
                  "--disable-pip-version-check", "--no-warn-script-location", *wheels]]
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
    engine_env = envs[env].get("engine_env") or {}
    if engine_env:   # what lets vLLM run without a dropped package, for every interpreter of the environment
        (Path(purelib) / "_epdbench_engine_env.pth").write_text(
            "".join(f"import os; os.environ.setdefault({k!r}, {v!r})\n" for k, v in sorted(engine_env.items())))
    if manifest.get("system_libs", {}).get("env") == env:
        place_system_libraries(work, venv, purelib)
    check_environment(env)
    (venv / MARKER).write_text(json.dumps({"bundle": manifest["bundle"], "environment": env,
                                           "tar_sha256": tar_meta["sha256"], "pins": manifest["pins"].get(env),
                                           "host_python": sys.executable,
                                           "installed_s": round(time.monotonic() - START, 1)}) + "\n")


parent = venvs[pending[0]].parent
parent.mkdir(parents=True, exist_ok=True)
work = Path(tempfile.mkdtemp(prefix=".epdbench-bundle-", dir=parent))
try:
    join_parts(work)
    for env in pending:
        venvs[env].parent.mkdir(parents=True, exist_ok=True)
        make_environment(env, work)
    say(f"installed in {time.monotonic() - START:.0f}s")
finally:
    shutil.rmtree(work, ignore_errors=True)
finish()
PY
