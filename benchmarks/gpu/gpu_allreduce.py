"""NCCL all-reduce of the presets' TP activations across the GPUs of one host: rows of physics/gpu_ops.py's CSV for
the cost model's all-reduce law (physics.allreduce).

Each row (op `allreduce`) times one all-reduce (sum) of tokens × hidden bf16 values, as vLLM reduces a
RowParallelLinear output (two per layer), for every LM_MODELS hidden size and ALLREDUCE_GRIDS token count (decode
batches and prefill steps), at each TP of ALLREDUCE_TPS the visible GPUs allow: one process per GPU
(torch.multiprocessing, no torchrun), one communicator per TP over the first TP ranks. Two ways (impl):
- cuda-graph: `inner` all-reduces captured in one CUDA graph and replayed, as vLLM runs decode: the GPUs' own time;
- eager: `inner` all-reduces launched from Python one after another: host launch costs included.
Timing (the device machine's METHOD.md): CUDA events after warm-up; a timed replay or loop lasts about target_ms,
rotating over copies of the buffer that together exceed the L2 four times; before each, the buffers get their
random values back (an in-place sum grows TP-fold per call) and the ranks meet; a repeat's time is its slowest
rank's; time_ms is the median per all-reduce over the repeats, time_min_ms and time_max_ms their spread. Each size
is checked once: the sum against every rank's values, regenerated from their seeds.

NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1
are set below, before torch loads NCCL, whatever the caller's environment says; no symmetric memory, no multimem
operations. NCCL picks its algorithm and protocol itself. vLLM's own custom all-reduce (IPC buffers, used for small
messages on NVLink) is not timed: these are NCCL's times, vLLM's path for the sizes its custom kernel leaves.

    python3 benchmarks/gpu/gpu_allreduce.py --out allreduce.csv [--quick] [--tps 2,4]
    python3 benchmarks/gpu/gpu_allreduce.py --out allreduce.csv --backend gloo --world 2 --quick   # CPU: the logic only

Prints the NCCL version and `nvidia-smi topo -m` first, and last a table: bytes, µs per all-reduce (graph, eager),
bus bandwidth (nccl-tests' busbw: bytes · 2(TP−1)/TP over the time). Needs PyTorch and, for NCCL, two or more CUDA
GPUs; never runs in CI (its gloo mode does, tests/test_gpu_allreduce.py). One file beside physics/gpu_ops.py, loaded by
path: a bare GPU machine needs these two copied and nothing installed.
"""
from __future__ import annotations

import os

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)        # before torch (and NCCL) load; the spawned ranks inherit it

import argparse                                    # noqa: E402
import datetime                                    # noqa: E402
import importlib.util                              # noqa: E402
import math                                        # noqa: E402
import socket                                      # noqa: E402
import subprocess                                  # noqa: E402
import sys                                         # noqa: E402
import time                                        # noqa: E402
from pathlib import Path                           # noqa: E402

import torch                                       # noqa: E402
import torch.distributed as dist                   # noqa: E402
import torch.multiprocessing as mp                 # noqa: E402

GRID_FILE = Path(__file__).resolve().parents[2] / "physics" / "gpu_ops.py"
_spec = importlib.util.spec_from_file_location("gpu_ops_grid", GRID_FILE)
G = importlib.util.module_from_spec(_spec)
sys.modules["gpu_ops_grid"] = G
_spec.loader.exec_module(G)

DT = torch.bfloat16
GROWTH_CALLS = 32        # in-place sums a buffer takes between refills: TP^32 stays inside bf16's range for TP ≤ 8
MAX_INNER = 200
CHECK_REL_ERR = 1e-2     # bf16 values summed: rounding lands near 4e-3


class Stopwatch:
    """ms from start() to stop(): CUDA events on the current stream, else the host clock (gloo blocks)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        if cuda:
            self.e0, self.e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self.e0.record()
        else:
            self.t0 = time.perf_counter_ns()

    def stop(self) -> float:
        if self.cuda:
            self.e1.record()
            self.e1.synchronize()
            return self.e0.elapsed_time(self.e1)
        return (time.perf_counter_ns() - self.t0) / 1e6


def values(rank: int, elems: int, copy: int, device: torch.device) -> torch.Tensor:
    """Rank `rank`'s random values for copy `copy` of a buffer of `elems`: any rank can regenerate them."""
    g = torch.Generator(device=device)
    g.manual_seed(1_000_003 * rank + 7_919 * copy + elems)
    return torch.randn(elems, generator=g, device=device, dtype=torch.float32).to(DT)


def sync(group, device: torch.device) -> None:
    """The ranks of `group` meet: a one-value all-reduce, waited for."""
    t = torch.ones(1, device=device)
    dist.all_reduce(t, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def agree(value: float, group, device: torch.device) -> float:
    """The largest of the ranks' values (so that every rank runs the same number of collectives)."""
    t = torch.tensor([value], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def slowest(times: list[float], group, device: torch.device) -> list[float]:
    """Each repeat's time on its slowest rank."""
    t = torch.tensor(times, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [float(x) for x in t.tolist()]


def inner_calls(est_ms: float, target_ms: float, copies: int) -> int:
    """All-reduces per timed replay: about target_ms of them, at most MAX_INNER and GROWTH_CALLS per copy."""
    return max(1, min(MAX_INNER, GROWTH_CALLS * copies, math.ceil(target_ms / max(est_ms, 1e-4))))


def buffer_copies(n_bytes: int, l2_bytes: int, most: int = 8) -> int:
    """Copies to rotate over so that one pass over them is four L2s."""
    return max(1, min(most, math.ceil(4 * l2_bytes / max(1, n_bytes))))


class Case:
    """One all-reduce size on one rank: its buffers, their refill, and the two ways of timing it."""

    def __init__(self, rank: int, tp: int, elems: int, group, device: torch.device, l2_bytes: int, grid):
        self.rank, self.tp, self.elems, self.group, self.device, self.grid = rank, tp, elems, group, device, grid
        self.copies = buffer_copies(2 * elems, l2_bytes)
        self.pristine = [values(rank, elems, c, device) for c in range(self.copies)]
        self.bufs = [p.clone() for p in self.pristine]
        self.cuda = device.type == "cuda"
        self.watch = Stopwatch(self.cuda)

    def call(self, i: int) -> None:
        dist.all_reduce(self.bufs[i % self.copies], group=self.group)

    def refill(self) -> None:
        for b, p in zip(self.bufs, self.pristine):
            b.copy_(p)

    def check(self) -> float:
        """Relative error of one all-reduce of copy 0 against the sum of every rank's values, in float32."""
        self.refill()
        self.call(0)
        ref = sum(values(r, self.elems, 0, self.device).float() for r in range(self.tp))
        err = float((self.bufs[0].float() - ref).norm() / ref.norm())
        return agree(err, self.group, self.device)

    def estimate_ms(self) -> float:
        self.refill()
        sync(self.group, self.device)
        self.watch.start()
        for i in range(self.copies):
            self.call(i)
        return agree(self.watch.stop() / self.copies, self.group, self.device)

    def timed(self, run, inner: int) -> list[float]:
        """ms per all-reduce of `run()` (inner of them), warm-up first, each repeat's slowest rank."""
        times = []
        for rep in range(self.grid.warmup + self.grid.repeats):
            self.refill()
            sync(self.group, self.device)
            self.watch.start()
            run()
            ms = self.watch.stop() / inner
            if rep >= self.grid.warmup:
                times.append(ms)
        return slowest(times, self.group, self.device)

    def eager(self, inner: int) -> list[float]:
        def run():
            for i in range(inner):
                self.call(i)
        return self.timed(run, inner)

    def graph(self, inner: int) -> list[float]:
        """Replays of `inner` all-reduces captured in one CUDA graph (without CUDA: the same calls from Python)."""
        if not self.cuda:
            return self.eager(inner)
        self.refill()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(3):
                self.call(i)
        torch.cuda.current_stream().wait_stream(side)
        sync(self.group, self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(inner):
                self.call(i)
        try:
            return self.timed(graph.replay, inner)
        finally:
            del graph


def bus_gb_s(n_bytes: float, tp: int, ms: float) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: bytes · 2(TP−1)/TP per second, in GB/s."""
    return n_bytes * 2 * (tp - 1) / tp / (ms / 1e3) / 1e9


def measure(rank: int, world: int, device: torch.device, opts: dict) -> None:
    cuda = device.type == "cuda"
    grid = G.ALLREDUCE_GRIDS[opts["grid"]]
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2 ** 20) if cuda else 2 ** 20
    label = f"nccl {opts['nccl']}" if cuda else "gloo"
    sink = G.OpsWriter(Path(opts["out"]), opts["meta"]) if rank == 0 else None
    failed = 0
    for tp in opts["tps"]:
        group = dist.new_group(list(range(tp)))              # every rank takes part in making it
        if rank < tp:
            for model, shape in G.LM_MODELS.items():
                for tokens in opts["tokens"] or grid.tokens:
                    elems = tokens * shape.hidden
                    case = Case(rank, tp, elems, group, device, l2, grid)
                    err = case.check()
                    if not err <= CHECK_REL_ERR:
                        failed += 1
                    inner = inner_calls(case.estimate_ms(), grid.target_ms, case.copies)
                    graph, eager = case.graph(inner), case.eager(inner)
                    if sink is not None:
                        common = dict(model=model, tp=tp, tokens=tokens, flops=(tp - 1) * elems, bytes_=2 * elems)
                        g = sink.emit("allreduce", f"{label} cuda-graph" if cuda else f"{label} host-loop", graph,
                                      **common)
                        e = sink.emit("allreduce", f"{label} eager", eager, **common)
                        print(f"  tp{tp} {model} {tokens} tokens, {2 * elems} B: graph {g * 1e3:.1f} µs "
                              f"({bus_gb_s(2 * elems, tp, g):.0f} GB/s bus), eager {e * 1e3:.1f} µs; {inner} per "
                              f"replay over {case.copies} copies; sum rel err {err:.1e}"
                              + ("" if err <= CHECK_REL_ERR else " FAILED"), flush=True)
                    del case
                    if cuda:
                        torch.cuda.empty_cache()
        sync(None, device)
    if sink is not None:
        sink.file.close()
    if failed:
        raise RuntimeError(f"rank {rank}: {failed} all-reduce sums off by more than {CHECK_REL_ERR}")


def worker(rank: int, world: int, port: int, opts: dict) -> None:
    cuda = opts["backend"] == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    kwargs = dict(backend=opts["backend"], init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                  timeout=datetime.timedelta(seconds=opts["collective_timeout_s"]))
    if cuda:
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    try:
        measure(rank, world, device, opts)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command_output(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return out.stdout.strip() if out.returncode == 0 else f"({' '.join(cmd)}: exit {out.returncode})"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"({' '.join(cmd)}: {exc.__class__.__name__})"


def summary(path: Path) -> list[str]:
    """The table printed last: per TP and size, µs per all-reduce both ways and the graph's bus bandwidth."""
    rows = G.read_ops_csv(path)
    by = {}
    for r in rows:
        by.setdefault((r.tp, r.bytes, r.model, r.tokens), {})["eager" if "eager" in r.impl else "graph"] = r
    lines = ["tp  model                         tokens        bytes   graph µs  eager µs  bus GB/s"]
    for (tp, n_bytes, model, tokens), ways in sorted(by.items()):
        g, e = ways.get("graph"), ways.get("eager")
        lines.append(f"{tp:<3} {model:<29} {tokens:>6} {int(n_bytes):>12} {g.time_ms * 1e3:>10.1f} "
                     f"{e.time_ms * 1e3:>9.1f} {bus_gb_s(n_bytes, tp, g.time_ms):>9.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="the CSV to write")
    ap.add_argument("--quick", action="store_true", help="a small grid: a smoke check")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl", help="gloo: CPU processes, the logic only")
    ap.add_argument("--world", type=int, default=0, help="processes (default: the visible GPUs; gloo: 2)")
    ap.add_argument("--tps", default=",".join(map(str, G.ALLREDUCE_TPS)),
                    help="TP sizes to time, those up to --world (default %(default)s)")
    ap.add_argument("--tokens", default="", help="token counts to time instead of the grid's, e.g. 1,8")
    ap.add_argument("--timeout-s", type=float, default=540, help="the whole run ends by then (default %(default)s)")
    args = ap.parse_args(argv)
    nccl = args.backend == "nccl"
    world = args.world or (torch.cuda.device_count() if nccl else 2)
    if nccl and (not torch.cuda.is_available() or torch.cuda.device_count() < max(2, world)):
        print(f"gpu_allreduce: {torch.cuda.device_count()} CUDA GPUs visible, {max(2, world)} needed: run it on a "
              "host with several, or --backend gloo to check the logic on CPU", file=sys.stderr)
        return 2
    try:
        tps = sorted({int(t) for t in args.tps.split(",") if t.strip()})
        tokens = tuple(sorted({int(t) for t in args.tokens.split(",") if t.strip()}))
    except ValueError:
        print(f"gpu_allreduce: --tps {args.tps!r} or --tokens {args.tokens!r}: give integers, e.g. 2,4",
              file=sys.stderr)
        return 2
    if any(t <= 0 for t in tokens):
        print(f"gpu_allreduce: --tokens {args.tokens!r}: token counts are positive", file=sys.stderr)
        return 2
    tps = [t for t in tps if 2 <= t <= world]
    if world < 2 or not tps:
        print(f"gpu_allreduce: --world {world} and --tps {args.tps} leave no TP of 2 or more to time: "
              "give --world 2 or more and --tps within it", file=sys.stderr)
        return 2
    version = torch.cuda.nccl.version() if nccl else ""
    version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    meta = dict(gpu=torch.cuda.get_device_name(0) if nccl else "cpu",
                driver=command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
                                      ).splitlines()[0] if nccl else "none",
                torch=torch.__version__, cuda=torch.version.cuda or "",
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    print(f"gpu_allreduce: {meta} world {world} TP {tps} grid {'quick' if args.quick else 'full'} "
          f"backend {args.backend} {version}; {' '.join(f'{k}={os.environ[k]}' for k in MULTICAST_OFF)}")
    if nccl:
        print("nvidia-smi topo -m:\n" + command_output(["nvidia-smi", "topo", "-m"]), flush=True)
    opts = dict(backend=args.backend, out=str(args.out), grid="quick" if args.quick else "full", tps=tps,
                tokens=tokens, meta=meta, nccl=version, collective_timeout_s=max(30.0, args.timeout_s / 2))
    start = time.perf_counter()
    ctx = mp.start_processes(worker, args=(world, free_port(), opts), nprocs=world, join=False,
                             start_method="spawn")
    try:
        while not ctx.join(timeout=2):
            if time.perf_counter() - start > args.timeout_s:
                print(f"gpu_allreduce: not done after {args.timeout_s:.0f} s: ranks stopped; the CSV keeps the rows "
                      "measured so far", file=sys.stderr)
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                return 1
    except mp.ProcessException as exc:
        print(f"gpu_allreduce: a rank failed: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    print("\n".join(summary(args.out)))
    print(f"gpu_allreduce: {args.out} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
