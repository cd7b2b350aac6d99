"""How things are named wherever they are shown (pure). A cell's load: a closed-loop cell by its concurrency, an
open-loop rate cell by its offered rate and its in-flight cap — its `concurrency` field is that cap
(RateSuite.max_in_flight), not a number of workers, so "concurrency 1024" would say what the cell never did. And
who an evidence reason is about, said once for many workers or endpoints alike."""
from __future__ import annotations

from epdbench.specs.workload import split_rate


def load_label(workload: str, concurrency: int, short: bool = False) -> str:
    """'concurrency 8' (short: 'c=8'), or for a rate cell '4 req/s (≤1024 in flight)'."""
    _, rate = split_rate(workload)
    if rate is not None:
        return f"{rate:g} req/s (≤{int(concurrency)} in flight)"
    return f"c={int(concurrency)}" if short else f"concurrency {int(concurrency)}"


def shape_label(workload: str, stream: str = "main") -> str:
    """The cell's request shape, without its rate, and its stream when not the main one: '512/64 (burst)'."""
    shape, _ = split_rate(workload)
    return shape if stream == "main" else f"{shape} ({stream})"


def cell_label(workload: str, concurrency: int, stream: str = "main", short: bool = False) -> str:
    """A matched cell in words: '512/64, concurrency 8', '1024/128, 4 req/s (≤1024 in flight)'; short, for
    one-line listings: '512/64 (burst) c=2', '1024/128 at 4 req/s (≤1024 in flight)'."""
    sep = ", " if not short else " at " if split_rate(workload)[1] is not None else " "
    return f"{shape_label(workload, stream)}{sep}{load_label(workload, concurrency, short)}"


NAMED = 3     # up to this many workers (or UCX endpoints) alike are named in a reason; more are counted per pod


def named_or_counted(members: list[tuple[str, str]], noun: str) -> str:
    """Who a reason is about, from (pod, name) pairs: 'pod name' alone, 'N <noun>s (pod name; …)' when a few,
    else 'N <noun>s (pod: k, …)' — so a line shared by many workers or endpoints is said once."""
    names = [f"{pod} {name}" for pod, name in members]
    if len(names) == 1:
        return names[0]
    if len(names) <= NAMED:
        return f"{len(names)} {noun}s ({'; '.join(names)})"
    pods = [pod for pod, _ in members]
    return f"{len(names)} {noun}s ({', '.join(f'{p}: {pods.count(p)}' for p in dict.fromkeys(pods))})"
