"""`epdbench compare`: when an interrupt's signal came but something on the way swallowed its exception, the run
still ends as interrupted (exit 130, its one line), never as a finished run."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the flow is replaced: an API address (never called) spares the start of Prefect's temporary server
NO_SERVER = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": "http://127.0.0.1:9/api"}

# the flow returns as if it had finished, after the signal handler ran (its exception lost on the way)
SWALLOWED = """
import os, signal, sys
from epdbench.flows import compare as flow
def finished(spec, **kwargs):
    try:
        os.kill(os.getpid(), signal.SIGTERM)    # the CLI's handler sets the flag, then raises KeyboardInterrupt
    except KeyboardInterrupt:
        pass                                      # ... which something swallows
    return {"all_verified": True, "regression": {}}
flow.compare = finished
from epdbench.cli import main
sys.exit(main(["compare", "--spec", sys.argv[1], "--out", sys.argv[2]]))
"""


def interrupted_compare(script: str, spec: Path, out: Path) -> subprocess.CompletedProcess:
    """`script` (a compare whose flow is replaced) run on `spec` into `out`; it must end as interrupted (130)."""
    done = subprocess.run([sys.executable, "-c", script, str(spec), str(out)], cwd=out.parent, capture_output=True,
                          text=True, timeout=120, env=NO_SERVER)
    assert done.returncode == 130, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def test_a_swallowed_interrupt_still_ends_the_run_as_interrupted(tiny_spec_path, tmp_path):
    out = tmp_path / "run"
    done = interrupted_compare(SWALLOWED, tiny_spec_path, out)
    assert done.stderr.strip().splitlines()[-1].startswith("interrupted: every started process was stopped")
    assert f"--resume {out}" in done.stderr


# the interrupt turns into another error on its way out, as when a terminal's Ctrl-C also ended Prefect's temporary
# server and the flow engine's crash report to it failed (httpx.ConnectError): the run hung, a traceback printed
REPLACED = """
import os, signal, sys
from epdbench.flows import compare as flow
def crashed(spec, **kwargs):
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        raise ConnectionRefusedError(111, "Connection refused") from None
flow.compare = crashed
from epdbench.cli import main
sys.exit(main(["compare", "--spec", sys.argv[1], "--out", sys.argv[2]]))
"""


def test_an_interrupt_turned_into_another_error_still_ends_the_run_as_interrupted(tiny_spec_path, tmp_path):
    out = tmp_path / "run"
    done = interrupted_compare(REPLACED, tiny_spec_path, out)
    assert done.stderr.strip().splitlines() == [
        f"interrupted: every started process was stopped; finished records kept in {out}, continue with: "
        f"epdbench compare --resume {out}"]


DEAF = """
import os, signal, sys, time
from epdbench.cli.commands import start_prefect_server_deaf_to_ctrl_c
from prefect.server.api.server import SubprocessASGIServer
start_prefect_server_deaf_to_ctrl_c()
server = SubprocessASGIServer().server_process
os.kill(server.pid, signal.SIGINT)                  # a terminal's Ctrl-C reaches the whole process group
time.sleep(1.0)
print("alive after SIGINT" if server.poll() is None else f"ended by SIGINT ({server.returncode})", flush=True)
SubprocessASGIServer().stop()                       # Prefect's own stop (SIGTERM) still ends it
print("stopped" if server.poll() is not None else "still running", flush=True)
"""


def test_prefect_s_temporary_server_outlives_a_terminal_s_ctrl_c_and_stops_on_sigterm(tmp_path):
    """A Ctrl-C in the terminal reaches compare and Prefect's temporary server alike; the server ended at once left
    the interrupted flow retrying its crash report for minutes. Started by compare with SIGINT blocked, it stays."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-c", DEAF], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.stdout.split("\n")[:2] == ["alive after SIGINT", "stopped"], done.stdout + done.stderr[-2000:]
