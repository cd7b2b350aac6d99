"""`epdbench compare`: when an interrupt's signal came but something on the way swallowed its exception, the run
still ends as interrupted (exit 130, its one line), never as a finished run."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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


def test_a_swallowed_interrupt_still_ends_the_run_as_interrupted(tiny_spec_path, tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", SWALLOWED, str(tiny_spec_path), str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 130, done.stdout[-2000:] + done.stderr[-2000:]
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
    done = subprocess.run([sys.executable, "-c", REPLACED, str(tiny_spec_path), str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 130, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"interrupted: every started process was stopped; finished records kept in {out}, continue with: "
        f"epdbench compare --resume {out}"]
