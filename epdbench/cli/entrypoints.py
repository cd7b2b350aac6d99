"""The commands other programs run rather than people: the in-cluster load generator Job's (`loadgen`), the trace
collector container's beside the router (`collect-traces`), and the making of vLLM's own environment for the local
target (`engine-env`, which CI and `--target local` call). Imports are deferred, as in commands."""
from __future__ import annotations

import sys
from pathlib import Path

from epdbench.cli.common import EXIT_FAILURES, EXIT_OK, CliError


def cmd_loadgen(args) -> int:
    """The in-cluster load generator: one suite, every record on stdout as soon as it finishes."""
    import json

    from epdbench.specs.models import SpecError, load_spec
    from epdbench.tasks.k8s.incluster_loadgen import run_loadgen
    try:
        spec = load_spec(args.spec)
    except SpecError as e:
        raise CliError(str(e)) from None
    calibration = None
    if args.calibration:
        try:
            calibration = json.loads(Path(args.calibration).read_text())
        except (OSError, ValueError) as e:
            raise CliError(f"{args.calibration}: unreadable calibration ({type(e).__name__}: {e})") from None
    try:
        only = set(filter(None, args.only.split(","))) if args.only else None
        run_loadgen(spec, args.suite, args.url, calibration, args.run, only)
    except ValueError as e:
        raise CliError(str(e)) from None
    return EXIT_OK


def cmd_collect_traces(args) -> int:
    """The in-cluster trace collector: serve until stopped."""
    from epdbench.tasks.k8s.incluster_traces import serve

    if not 0 < args.port < 65536:
        raise CliError(f"--port {args.port}: a TCP port, 1 to 65535")
    if args.max_spans < 1:
        raise CliError(f"--max-spans {args.max_spans}: at least 1")
    try:
        return serve(args.host, args.port, args.max_spans)
    except OSError as e:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None


def cmd_engine_env(args) -> int:
    """Make (or check) vLLM's CPU environment; its python on stdout, progress on stderr. With --wheelhouse, build
    the offline bundle for a GPU host instead; its folder on stdout."""
    from epdbench.tasks.local.engine_env import EngineEnvError, ensure_engine_env

    if args.wheelhouse:
        return build_wheelhouse(args)
    for flag in ("part_mib", "vllm_wheel", "downloads"):
        if getattr(args, flag) is not None:
            raise CliError(f"--{flag.replace('_', '-')}: applies with --wheelhouse only")
    try:
        python = ensure_engine_env(Path(args.dir) if args.dir else None,
                                   say=lambda line: print(line, file=sys.stderr, flush=True))
    except EngineEnvError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILURES
    print(python)
    return EXIT_OK


def build_wheelhouse(args) -> int:
    """`engine-env --wheelhouse DIR`: the offline vLLM bundle for a GPU host (tasks/local/wheelhouse_build.py)."""
    from epdbench.tasks.local.wheelhouse import WheelhouseError
    from epdbench.tasks.local.wheelhouse_build import INSTALLER, build_bundle, check_bundle_dir
    from epdbench.tasks.local.wheelhouse_pins import PART_MIB, VLLM_WHEEL

    if args.dir:
        raise CliError("--dir: names the CPU environment; the bundle's environment is made on the GPU host by its "
                       "install.sh (--venv there)")
    part_mib = PART_MIB if args.part_mib is None else args.part_mib
    if not 1 <= part_mib <= 2047:
        raise CliError(f"--part-mib {part_mib}: 1 to 2047")
    vllm_wheel = Path(args.vllm_wheel).expanduser() if args.vllm_wheel else None
    if vllm_wheel and (vllm_wheel.name != VLLM_WHEEL or not vllm_wheel.is_file()):
        raise CliError(f"--vllm-wheel {args.vllm_wheel}: give the file {VLLM_WHEEL} (no such file, or another "
                       "wheel)")
    out = Path(args.wheelhouse).expanduser().absolute()
    try:
        check_bundle_dir(out)
    except WheelhouseError as e:
        raise CliError(str(e)) from None
    try:
        manifest = build_bundle(out, Path(args.downloads).expanduser() if args.downloads else None, vllm_wheel,
                                part_mib, say=lambda line: print(line, file=sys.stderr, flush=True))
    except WheelhouseError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILURES
    parts = manifest["parts"]
    print(f"copy the {len(parts)} parts ({sum(p['bytes'] for p in parts) / 2**20:.0f} MiB), manifest.json and "
          f"{INSTALLER} of {out} to the GPU host, then run there: bash {INSTALLER}", file=sys.stderr)
    print(out)
    return EXIT_OK
