"""epdbench command line. Bad input gets one line naming the field and the fix, and exit code 2.

Exit codes of `compare`: 0 all configurations ran and their evidence holds (verified, or emulated
on the simulator) and everything reached MLflow; 2 bad input (also: the results folder is held by
another run, or a state file is unreadable); 3 completed with failures, degraded cells or unverified
evidence; 4 (with --fail-on-regression) a metric regressed beyond the noise of the previous runs;
5 results kept but not published (MLflow unreachable or refusing: `epdbench sync RUN`); 6 results could
not be written (disk full); 130 interrupted (Ctrl-C or SIGTERM).
Exit codes of `sync`: 0 published (or nothing left to publish); 2 no such results folder, or a file of it
unreadable; 5 MLflow unreachable or refusing (its reason in the line); 6 the folder could not be written.
"""
from __future__ import annotations

import os
import signal
import sys

from epdbench.cli import commands, entrypoints, planning
from epdbench.cli.common import (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_NO_SPACE, INTERRUPTED_RUN, NO_SPACE_ERRNOS,
                                 CliError)
from epdbench.cli.parser import build_parser

COMMANDS = {"compare": commands.cmd_compare, "report": commands.cmd_report, "history": commands.cmd_history,
            "plan": commands.cmd_plan, "up": commands.cmd_up, "down": commands.cmd_down, "sync": commands.cmd_sync,
            "verify-transport": commands.cmd_verify_transport, "manifests": commands.cmd_manifests,
            "cleanup": commands.cmd_cleanup, "loadgen": entrypoints.cmd_loadgen,
            "collect-traces": entrypoints.cmd_collect_traces, "engine-env": entrypoints.cmd_engine_env,
            "whatif": planning.cmd_whatif, "calibrate": planning.cmd_calibrate}


def terminate_children(grace_s: float = 5.0) -> None:
    """SIGTERM every direct child process still running, then SIGKILL what remains after grace_s."""
    import time

    from epdbench.tasks.rundir.runstate import children_of, process_start_time

    def children() -> list[int]:   # running ones: a zombie has no start time
        return [pid for pid in children_of(os.getpid()) if process_start_time(pid) is not None]

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
        from epdbench.tasks.proc.processes import stop_all
        stop_all()
        terminate_children()
        rdir, note = INTERRUPTED_RUN.get("dir"), INTERRUPTED_RUN.get("note")
        kept = (f"; finished records kept in {rdir}, continue with: epdbench compare --resume {rdir}" if rdir
                else f"; {note}" if note else "")
        print(f"interrupted: every started process was stopped{kept}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)
    except OSError as e:
        if e.errno not in NO_SPACE_ERRNOS:
            raise
        rdir = INTERRUPTED_RUN.get("dir")
        then = f"; free space, then continue with: epdbench compare --resume {rdir}" if rdir else ""
        print(f"error: cannot write results: {os.strerror(e.errno)} (in {e.filename or rdir or 'the results folder'})"
              f"{then}", file=sys.stderr)
        return EXIT_NO_SPACE
    except Exception as e:  # noqa: BLE001
        from epdbench.specs.models import SpecError
        from epdbench.tasks.rundir.resume import StateError
        from epdbench.tasks.rundir.runstate import FolderLocked
        if isinstance(e, (SpecError, StateError, FolderLocked)):
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise




if __name__ == "__main__":
    sys.exit(main())
