"""How things are named wherever they are shown (pure): who an evidence reason is about, said once for many
workers or endpoints alike."""
from __future__ import annotations


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
