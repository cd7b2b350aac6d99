"""Whether a fault leaves a GPU's memory held: the real-engine faults of tests/faults/test_faults_local.py run on a
GPU host (`compare --target local`, real vLLM engines on CUDA), with each GPU's used memory read through NVML before
the fault and after it, until it is back to what it was or `--settle-s` passed. An orphaned engine core or worker
holds its share of the GPU until someone ends it: this is where it shows.

    python benchmarks/gpu/fault_gpu_memory.py --vllm-python PY --out DIR [--spec gpu-qwen25vl] [--faults a,b]

The spec's `aggregated` and `pd-nixl-tcp` configurations serve, each with one small fixed cell (1024 tokens in, 64
out, concurrency 2, 16 requests). Faults (all by default):

  prefill-killed   the PD pair's prefill engine SIGKILLed mid-cell (its configuration fails, the next one runs)
  decode-killed    the PD pair's decode engine SIGKILLed mid-cell
  kv-unreachable   every third decode leg told of a NIXL side channel no one listens on
                   (EPDBENCH_FAULT_KV_UNREACHABLE_EVERY, read by epdbench's proxy)
  bad-argument     an engine argument vLLM does not know
  start-timeout    target.local.startup_timeout_s too short for the engines to become ready
  run-killed       compare SIGKILLed while its engine starts, `cleanup`, then `--resume` to the end
  sigterm, ctrl-c  the signal while the engines start (compare exits 130)

Prints one line per fault: compare's exit code, the seconds until the fault's configuration failed or the run ended,
the seconds until no process of the run remained, and per GPU the used MiB before, after and how long it took to
come back. Exit 0 when every GPU came back within `--tolerance-mib` of its baseline after every fault, 3 otherwise.
Not run here (no GPU on the development VM); the CPU lane's tests run the same faults.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from epdbench.tasks.local.nvml import load_nvml
from epdbench.tasks.rundir.runstate import descendants_of, process_start_time, read_registry

FAULTS = ["prefill-killed", "decode-killed", "kv-unreachable", "bad-argument", "start-timeout", "run-killed",
          "sigterm", "ctrl-c"]
KV_FAULT_ENV = "EPDBENCH_FAULT_KV_UNREACHABLE_EVERY"     # epdbench.sim.proxy's, by name: no import of the proxy


def gpu_used_mib(nvml) -> list[float]:
    return [nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).used / 2**20
            for i in range(nvml.nvmlDeviceGetCount())]


def fault_spec(preset: str, fault: str, out: Path) -> Path:
    """The preset with the configurations a fault needs and one small fixed cell."""
    path = Path(preset) if Path(preset).exists() else Path(__file__).resolve().parents[2] / "specs" / f"{preset}.yaml"
    spec = yaml.safe_load(path.read_text())
    wanted = {"prefill-killed": ["pd-nixl-tcp", "aggregated"], "decode-killed": ["pd-nixl-tcp", "aggregated"],
              "kv-unreachable": ["pd-nixl-tcp"], "start-timeout": ["pd-nixl-tcp"]}.get(fault, ["aggregated"])
    by_name = {c["name"]: c for c in spec["configurations"]}
    spec["configurations"] = [by_name[name] for name in wanted]      # the killed configuration first
    spec["suites"] = [{"kind": "fixed", "name": "fixed", "shapes": [{"input_tokens": 1024, "output_tokens": 64}],
                       "concurrencies": [2], "n_warmup": 1, "n_measured": 16}]
    local = spec.setdefault("target", {}).setdefault("local", {})
    local["router"] = "builtin"
    if fault == "bad-argument":
        local["extra_args"] = [*local.get("extra_args", []), "--no-such-argument"]
    if fault == "start-timeout":
        local["startup_timeout_s"] = 30
    written = out / f"spec-{fault}.yaml"
    written.write_text(yaml.safe_dump(spec))
    return written


class Compare:
    """One `compare --target local` in the background, in a process group of its own, its output in a file; every
    registered process's tree remembered as it runs."""

    def __init__(self, args, fault: str):
        self.args, self.fault = args, fault
        self.rdir = args.out / fault / "run"
        self.rdir.parent.mkdir(parents=True, exist_ok=True)
        self.seen: dict[int, int] = {}

    def launch(self, spec: Path | None, env: dict | None = None) -> subprocess.Popen:
        what = ["--spec", str(spec), "--out", str(self.rdir)] if spec else ["--resume", str(self.rdir)]
        self.output = self.rdir.parent / f"output-{time.monotonic_ns()}.txt"
        with open(self.output, "w") as fh:
            return subprocess.Popen([sys.executable, "-m", "epdbench.cli", "compare", "--target", "local",
                                     "--vllm-python", self.args.vllm_python, *what, "--tracking-uri",
                                     f"sqlite:///{self.rdir.parent / 'mlflow.db'}"], stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})})

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def watch(self) -> None:
        for e in read_registry(self.rdir) if self.rdir.exists() else []:
            for pid in [e["pid"], *descendants_of(e["pid"])]:
                self.seen.setdefault(pid, process_start_time(pid) or -1)

    def until(self, done, proc: subprocess.Popen | None, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not done():
            self.watch()
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.05)
        return time.monotonic()

    def alive(self) -> list[int]:
        return [pid for pid, start in self.seen.items() if process_start_time(pid) == start]

    def log(self, config: str, name: str) -> str:
        path = self.rdir / "evidence" / config / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def inject(c: Compare, spec: Path) -> tuple[int, float]:
    """Run the fault; (compare's exit code, seconds from the fault to its configuration's end or the run's)."""
    f = c.fault
    if f in ("prefill-killed", "decode-killed"):
        proc = c.launch(spec)
        c.until(lambda: "[pd-nixl-tcp] serving at" in c.text(), proc, 1800)
        victim = "prefill-0" if f == "prefill-killed" else "decode-0"
        c.until(lambda: c.log("pd-nixl-tcp", victim).count("Received request") >= 4, proc, 300)
        pid = next(e["pid"] for e in read_registry(c.rdir) if e["what"] == f"pd-nixl-tcp/{victim}")
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        done = c.until(lambda: "[pd-nixl-tcp] FAILED" in c.text(), proc, 600)
        return proc.wait(timeout=3600), done - t0
    if f in ("kv-unreachable", "bad-argument", "start-timeout"):
        t0 = time.monotonic()
        proc = c.launch(spec, {KV_FAULT_ENV: "3"} if f == "kv-unreachable" else None)
        return proc.wait(timeout=3600), time.monotonic() - t0
    if f == "run-killed":
        proc = c.launch(spec)
        c.until(lambda: any(_comm(p).startswith("VLLM::EngineCor") for p in c.seen), proc, 900)   # comm: 15 chars
        t0 = time.monotonic()
        proc.kill()
        proc.wait(timeout=60)
        gone = c.until(lambda: not c.alive(), None, 120)
        subprocess.run([sys.executable, "-m", "epdbench.cli", "cleanup", "--run", str(c.rdir)], check=False)
        resumed = c.launch(None)
        return resumed.wait(timeout=3600), gone - t0
    proc = c.launch(spec)                                     # sigterm, ctrl-c: while the engines start
    c.until(lambda: "Initializing model took" in c.log("aggregated", "server-0")
            or "Loading weights took" in c.log("aggregated", "server-0"), proc, 900)
    t0 = time.monotonic()
    if f == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=600), time.monotonic() - t0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-python", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--spec", default="gpu-qwen25vl")
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--settle-s", type=float, default=120.0)
    p.add_argument("--tolerance-mib", type=float, default=256.0)
    args = p.parse_args(argv)
    faults = args.faults.split(",")
    if unknown := sorted(set(faults) - set(FAULTS)):
        print(f"unknown fault(s): {', '.join(unknown)}; known: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    try:
        nvml = load_nvml()
    except RuntimeError as e:
        print(f"no GPU memory to read: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results, ok = [], True
    for fault in faults:
        before = gpu_used_mib(nvml)
        c = Compare(args, fault)
        code, detected_s = inject(c, fault_spec(args.spec, fault, args.out))
        t_end = time.monotonic()
        c.until(lambda: not c.alive(), None, args.settle_s)
        cleaned_s = time.monotonic() - t_end
        after, back_s = gpu_used_mib(nvml), None
        while time.monotonic() - t_end < args.settle_s:
            after = gpu_used_mib(nvml)
            if all(a - b <= args.tolerance_mib for a, b in zip(after, before)):
                back_s = time.monotonic() - t_end
                break
            time.sleep(0.5)
        row = {"fault": fault, "exit": code, "detected_s": round(detected_s, 2), "cleaned_s": round(cleaned_s, 2),
               "left": c.alive(), "used_mib_before": [round(x) for x in before],
               "used_mib_after": [round(x) for x in after], "back_s": None if back_s is None else round(back_s, 2)}
        ok &= back_s is not None and not row["left"]
        results.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "fault_gpu_memory.json").write_text(json.dumps(results, indent=1))
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
