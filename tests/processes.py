"""Finding what a test run left behind: every descendant of a command inherits EPDBENCH_TEST_MARK."""
from pathlib import Path


def marked_processes(mark: str) -> list[int]:
    """Processes whose environment carries the mark."""
    out = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"EPDBENCH_TEST_MARK={mark}".encode() in environ.read_bytes():
                out.append(int(environ.parent.name))
        except OSError:
            continue
    return out


def processes_naming(texts: list[str]) -> list[int]:
    """Processes whose command line contains one of `texts` (a run's folder, a port as ':PORT')."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(t in line for t in texts):
            out.append(int(cmdline.parent.name))
    return out
