"""Free ports for the test servers, and proof that a server listens on its own.

A port probed free can be taken by another test process before our server binds it; the
server then dies, but the other process answers our readiness probe, and every request of
the session reaches the wrong server. So a server is ready only when its own process holds
the listening socket (read from /proc: the tests run on Linux).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

LISTEN = "0A"  # TCP state in /proc/net/tcp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def owns_port(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on `port`."""
    inodes = _listening_inodes(port)
    if not inodes:
        return False
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False
