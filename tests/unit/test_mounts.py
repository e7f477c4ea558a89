"""Registration's fast path checks a local tier's files on the event loop only when every
local tier lies on a disk of this machine (app.storage.mounts): a network file system's
calls can wait on its server, and would stall the whole API process."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.storage import mounts
from app.storage.mounts import all_on_local_disks, file_system_type, mount_types

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
40 27 0:45 / /data rw,relatime shared:20 - xfs /dev/sdb1 rw
41 40 0:46 / /data/shared rw,relatime shared:21 - nfs4 filer:/export rw,vers=4.2
42 27 0:47 / /mnt/my\\040bucket rw,nosuid - fuse.s3fs s3fs rw,user_id=0
43 27 0:48 / /scratch rw - lustre 10.0.0.1@tcp:/scratch rw
"""


def test_each_path_gets_the_type_of_the_longest_mount_above_it() -> None:
    found = mount_types(MOUNTINFO)
    assert found["/mnt/my bucket"] == "fuse.s3fs"  # mountinfo escapes spaces
    assert file_system_type("/data/ckpt/hot", found) == "xfs"
    assert file_system_type("/data/shared/ckpt", found) == "nfs4"
    assert file_system_type("/data/sharedness", found) == "xfs"  # a name, not a prefix
    assert file_system_type("/home/nobody/not-made-yet", found) == "ext4"


@pytest.mark.parametrize(
    ("paths", "on_disks"),
    [
        (["/data/hot", "/home/ckpt/warm"], True),
        (["/data/hot", "/data/shared/cold"], False),
        (["/mnt/my bucket/ckpt"], False),
        (["/scratch/ckpt"], False),
        ([], True),
    ],
)
def test_only_local_disks_keep_the_checks_on_the_loop(
    paths: list[str], on_disks: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO, encoding="utf-8")
    monkeypatch.setattr(mounts, "MOUNTINFO", table)
    assert all_on_local_disks(paths) is on_disks


def test_unreadable_mounts_count_as_network_file_systems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mounts, "MOUNTINFO", tmp_path / "missing")
    assert all_on_local_disks(["/data/hot"]) is False
