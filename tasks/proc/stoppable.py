"""asyncio.run for a run's main thread, where a SIGTERM must stop the run at once and never be lost.

A signal handler runs in the main thread between two bytecodes, wherever that thread is. During a flow run
Prefect's handler for SIGTERM raises its TerminationSignal, a BaseException but not a KeyboardInterrupt; raised
inside an event loop, it lands in whatever runs at that moment, and asyncio re-raises only KeyboardInterrupt and
SystemExit from there: a task keeps the exception as its result, so the run goes on until something awaits that
task, if anything does, and a callback's is logged and dropped. Measured on `epdbench compare` of a one-cell
PD spec, SIGTERM sent at 32 moments from its start to its end: once the signal was lost and the run went on
to end with exit code 0 and every record measured, as CI's fault lane had caught.

`run` therefore keeps SIGTERM to itself while the loop runs: the signal cancels the main coroutine (which
cleans up as on any cancellation: the load generator closes its session, a cell's finished requests are not
recorded as the cell) and, once the loop is closed, is handed to the handler that was in place before —
Prefect's, the CLI's — in plain code, where its exception propagates as it does anywhere else in the run.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main); a SIGTERM meanwhile cancels `main`, then goes to the previous SIGTERM handler (whose
    exception, if it raises one, replaces the cancellation). Off the main thread (no signals there), or with
    SIGTERM ignored, plain asyncio.run."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) in (
            signal.SIG_IGN, None):
        return asyncio.run(main)
    received: list[int] = []
    running: dict = {}

    def on_term(signum, frame) -> None:
        received.append(signum)
        task, loop = running.get("task"), running.get("loop")
        if task is not None and not task.done() and not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)

    async def guarded() -> T:
        running["loop"], running["task"] = asyncio.get_running_loop(), asyncio.current_task()
        if received:              # it came before the loop started: never begin
            main.close()
            raise asyncio.CancelledError
        return await main

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return asyncio.run(guarded())
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            deliver(previous, received[0])


def deliver(handler, signum: int) -> None:
    """What `handler` (a signal.signal value) does with `signum`, now, in this thread: call it, or for the
    default action signal the process again (it ends), or nothing if it was ignored."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)
