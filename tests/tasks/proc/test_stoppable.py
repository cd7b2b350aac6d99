"""tasks/proc/stoppable.py: a SIGTERM while a run's event loop runs stops it at once, its cleanup done, and reaches the
handler that was in place (Prefect's or the CLI's) in plain code — never lost in a task or callback."""
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from epdbench.tasks.proc import stoppable

ROOT = Path(__file__).resolve().parents[3]


class Terminated(BaseException):
    """What the previous handler raises (as Prefect's raises TerminationSignal: a BaseException, not a
    KeyboardInterrupt)."""


@pytest.fixture
def raising_handler():
    seen: list[int] = []

    def handler(signum, frame):
        seen.append(signum)
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    yield handler, seen
    signal.signal(signal.SIGTERM, previous)


def test_a_signal_lost_in_a_background_task_under_plain_asyncio_run_stops_the_run_here(raising_handler):
    handler, seen = raising_handler
    cleaned = []

    async def main(run_id: str) -> str:
        async def background():          # the handler runs inside this task's step, as when a signal lands there
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0)
        keep = asyncio.get_running_loop().create_task(background())
        try:
            await asyncio.sleep(0.5)
            return run_id
        finally:
            cleaned.append(run_id)
            keep.cancel()

    # plain asyncio.run: the handler's exception becomes the background task's result, and the run goes on
    assert asyncio.run(main("plain")) == "plain" and seen == [signal.SIGTERM]
    t0 = time.monotonic()
    with pytest.raises(Terminated):
        stoppable.run(main("stoppable"))
    assert time.monotonic() - t0 < 0.4                     # cancelled at once, not after the 0.5 s sleep
    assert cleaned == ["plain", "stoppable"] and seen == [signal.SIGTERM] * 2
    assert signal.getsignal(signal.SIGTERM) is handler     # the previous handler is back


def test_a_signal_at_any_await_cancels_the_run_and_its_cleanup_runs_first(raising_handler):
    events = []

    async def main():
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        finally:
            events.append("cleanup")

    t0 = time.monotonic()
    with pytest.raises(Terminated):
        stoppable.run(main())
    assert time.monotonic() - t0 < 5 and events == ["cancelled", "cleanup"]


def test_without_a_signal_it_is_asyncio_run_and_a_handler_that_does_not_raise_leaves_the_cancellation():
    async def answer():
        await asyncio.sleep(0)
        return 42
    assert stoppable.run(answer()) == 42

    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        async def main():
            asyncio.get_running_loop().call_later(0.01, os.kill, os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        with pytest.raises(asyncio.CancelledError):
            stoppable.run(main())
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_off_the_main_thread_it_runs_plainly():
    out = []

    async def main():
        return "done"
    worker = threading.Thread(target=lambda: out.append(stoppable.run(main())))
    worker.start()
    worker.join(timeout=10)
    assert out == ["done"]


def test_with_the_default_action_the_process_still_ends_by_the_signal_after_its_cleanup():
    code = ("import asyncio, os, signal\n"
            "from epdbench.tasks.proc import stoppable\n"
            "async def main():\n"
            "    asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)\n"
            "    try:\n"
            "        await asyncio.sleep(30)\n"
            "    finally:\n"
            "        print('cleaned up', flush=True)\n"
            "stoppable.run(main())\n"
            "print('not reached', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -signal.SIGTERM and done.stdout == "cleaned up\n"
