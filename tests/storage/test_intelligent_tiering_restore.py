"""An object in an S3 Intelligent-Tiering archive access tier is restored through the same
path as a Glacier one before it is read: `restore_state` says "archived", the restore is
asked for once (without `Days`, which Intelligent-Tiering refuses), and the object reads
once S3 has moved it back to the frequent access tier.

Neither moto nor `rclone serve s3` has archive access tiers; this talks to a recording of
S3's documented answers (HeadObject's `x-amz-archive-status`, GetObject's 403
InvalidObjectState, RestoreObject's 202), the adapter and botocore unchanged."""

from __future__ import annotations

import threading
from xml.etree import ElementTree

import pytest

from app.storage.base import ArchivedObject
from app.storage.s3 import S3Storage
from tests.storage.recorded_s3 import Answer, RecordedS3, Request, xml
from tests.storage.s3_servers import dummy_credentials

DATA = b"weights kept in the deep archive access tier"
KEY = "/bucket/tier/ck/model.bin"


class ArchivedObjectServer:
    """One object: archived, then restoring once asked, then back in frequent access."""

    def __init__(self) -> None:
        self.state = "archived"
        self.lock = threading.Lock()

    def answer(self, request: Request) -> Answer | None:
        if request.path != KEY:
            return None
        with self.lock:
            state = self.state
            if request.method == "POST" and "restore" in request.query:
                if state == "restoring":
                    return Answer(409, {}, _error("RestoreAlreadyInProgress"))
                self.state = "restoring"
                return Answer(202)
        headers = {
            "Content-Length": str(len(DATA)),
            "ETag": '"5d41402abc4b2a76b9719d911017c592"',
            "x-amz-storage-class": "INTELLIGENT_TIERING",
        }
        if state != "readable":
            headers["x-amz-archive-status"] = "DEEP_ARCHIVE_ACCESS"
        if state == "restoring":
            headers["x-amz-restore"] = 'ongoing-request="true"'
        if request.method == "HEAD":
            return Answer(200, headers)
        if request.method == "GET":
            if state != "readable":
                return Answer(403, {}, _error("InvalidObjectState"))
            return Answer(200, headers, DATA)
        return None


def _error(code: str) -> bytes:
    return xml(f"<Error><Code>{code}</Code><Message>{code}</Message></Error>").replace(
        b' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"', b""
    )


@pytest.fixture
def archived() -> ArchivedObjectServer:
    dummy_credentials()
    return ArchivedObjectServer()


def test_an_archive_access_object_is_restored_before_it_is_read(
    archived: ArchivedObjectServer,
) -> None:
    with RecordedS3(archived.answer) as server:
        storage = S3Storage("bucket", "tier", endpoint_url=server.url)

        assert storage.restore_state("ck/model.bin") == "archived"
        with pytest.raises(ArchivedObject):
            storage.open_read("ck/model.bin").read()

        storage.request_restore("ck/model.bin", days=3)
        assert storage.restore_state("ck/model.bin") == "restoring"
        storage.request_restore("ck/model.bin", days=3)  # while it runs: not asked again

        [asked] = [r for r in server.requests if r.method == "POST"]
        request = ElementTree.fromstring(asked.body)
        names = {element.tag.rsplit("}", 1)[-1] for element in request.iter()}
        assert "Days" not in names  # Intelligent-Tiering refuses it
        assert "Tier" in names

        archived.state = "readable"  # S3 moved it back to frequent access
        assert storage.restore_state("ck/model.bin") == "readable"
        with storage.open_read("ck/model.bin") as reader:
            assert reader.read() == DATA
