"""The cluster tier's network: a namespace of its own with only the loopback interface, so that whatever the
control plane, the pod player or a run dials, nothing can leave this machine. kwok's pods carry addresses of a
private range in their status; in this namespace a connection to one fails at once (ENETUNREACH) instead of
going anywhere. Entered once, by the whole test process, before any thread or child starts (conftest)."""
from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def interfaces() -> list[str]:
    with open("/proc/net/dev") as fh:
        return sorted(line.split(":")[0].strip() for line in fh.readlines()[2:])


def isolate() -> str | None:
    """Enter a new network namespace and bring its loopback up; None on success, else why not (not root, no
    namespaces here): the tier then runs in the host's network, loopback by its own addresses alone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return os.strerror(ctypes.get_errno())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14s", b"lo", 0, bytes(14)))
        flags = struct.unpack("16sH14s", ifr)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, bytes(14)))
    return None
