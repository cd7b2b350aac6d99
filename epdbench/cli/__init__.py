"""epdbench command line. Bad input gets one line naming the field and the fix, and exit code 2.

Exit codes of `compare`: 0 all configurations ran and their evidence holds (verified, or emulated
on the simulator); 2 bad input; 3 completed with failures or unverified evidence; 4 (with
--fail-on-regression) a metric regressed beyond the noise of the previous runs.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from epdbench.cli import commands
from epdbench.cli.common import EXIT_BAD_INPUT, CliError
from epdbench.cli.parser import build_parser

COMMANDS = {"compare": commands.cmd_compare, "report": commands.cmd_report, "history": commands.cmd_history,
            "plan": commands.cmd_plan, "up": commands.cmd_up, "down": commands.cmd_down, "sync": commands.cmd_sync,
            "verify-transport": commands.cmd_verify_transport, "manifests": commands.cmd_manifests,
            "cleanup": commands.cmd_cleanup}


def terminate_children(grace_s: float = 5.0) -> None:
    """SIGTERM every direct child process still running, then SIGKILL what remains after grace_s."""
    import time

    def children() -> list[int]:
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.append(int(stat.parent.name))
        return out

    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = children()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            for pid in list(pids):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        pids.remove(pid)
                except ChildProcessError:
                    pids.remove(pid)
            time.sleep(0.1)
        if not pids:
            return


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:
        from epdbench.sim.server import main as sim_main
        return sim_main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        # Teardown already ran in the flow's finally blocks; stop any straggler (simulator processes,
        # Prefect's temporary server), then leave without waiting on background threads, which can hang
        # once their server is gone.
        from epdbench.tasks.sim_target import stop_all
        stop_all()
        terminate_children()
        print("interrupted: every started process was stopped", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)
    except Exception as e:  # noqa: BLE001
        from epdbench.specs.models import SpecError
        if isinstance(e, SpecError):
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise




if __name__ == "__main__":
    sys.exit(main())
