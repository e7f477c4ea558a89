"""Whether a local tier's directory sits on a disk of this machine, or on a file system
whose calls wait on a server (NFS, SMB, Lustre, a FUSE mount of a bucket...).

Registration's fast path checks a local tier's uri and manifest (a few `lstat`s and one
directory listing) on the event loop when every local tier is on a local disk, where
those calls take microseconds: handed to a thread instead, each call had to take the
interpreter lock back from the busy loop, and one API process made a quarter fewer
registrations a second (bench/README.md). A call to a network file system can wait as
long as its server does, and would stall every request of the process: such tiers keep
the thread. Anything this module cannot name is treated as such a file system.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_OCTAL = re.compile(r"\\([0-7]{3})")

# Disks of this machine, and memory: a call waits on no server.
LOCAL_FILE_SYSTEMS = frozenset(
    {
        "bcachefs",
        "btrfs",
        "exfat",
        "ext2",
        "ext3",
        "ext4",
        "f2fs",
        "jfs",
        "ntfs3",
        "overlay",
        "ramfs",
        "squashfs",
        "tmpfs",
        "vfat",
        "xfs",
        "zfs",
    }
)


def mount_types(mountinfo: str) -> dict[str, str]:
    """Mount point -> file system type, from the text of /proc/self/mountinfo (later
    mounts over the same point win, as they hide the earlier)."""
    found: dict[str, str] = {}
    for line in mountinfo.splitlines():
        before, separator, after = line.partition(" - ")
        fields = before.split()
        if not separator or len(fields) < 5 or not after:
            continue
        point = _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4])  # a space is \040
        found[point] = after.split()[0]
    return found


def file_system_type(path: str, mounts: dict[str, str]) -> str | None:
    """The type of the file system `path` lies on: that of the longest mount point above
    its real path (the nearest directory that exists, for a tier not made yet)."""
    real = os.path.realpath(path)
    best = None
    for point, kind in mounts.items():
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, kind)
    return best[1] if best is not None else None


def all_on_local_disks(paths: list[str]) -> bool:
    """Whether every one of `paths` lies on a local disk (False where the machine's
    mounts cannot be read, as on a system without /proc)."""
    if not paths:
        return True
    try:
        mounts = mount_types(MOUNTINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return False
    return all(file_system_type(path, mounts) in LOCAL_FILE_SYSTEMS for path in paths)
