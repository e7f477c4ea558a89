"""Full-object checksums on S3: which ones an answer vouches for, which listed objects are
worth a HeadObject to learn theirs, and what the service asks for when it writes.

An S3 object carries at most one checksum of an algorithm its writer chose (or S3's
default, CRC64NVME, where the writer chose none). Of a single-part object it covers the
whole object. Of a multipart object it is either FULL_OBJECT, a CRC of every byte (S3
combines the parts' CRCs), or COMPOSITE, a checksum of the parts' checksums shown as
"<value>-<parts>", which matches nothing a manifest or another provider could compute.
CRC64NVME exists only as FULL_OBJECT. Only full-object values are comparable with a
manifest; a multipart ETag ("<hex>-<parts>") is no MD5 either.

Listings name each object's algorithm (`ChecksumAlgorithm`) and, on AWS, its
`ChecksumType`, but never the value: that takes a HeadObject with ChecksumMode=ENABLED.
A registration lists a checkpoint's files once, so it asks only for the objects whose
listing promises a comparable value (`worth_a_head`); a bucket whose objects carry none
(or only CRC32, or a composite) costs the listing alone. The import and a tier's scan list
millions of objects and never ask (they call `iter_prefix` / `list_prefix` without
checksums).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from app.storage.base import ObjectInfo

if TYPE_CHECKING:
    from app.storage.s3.calls import S3Calls
    from app.storage.s3.client import ChecksumMode

# What the service asks S3 to keep for every object it writes: always full-object, so a
# copy's figure is comparable with a manifest's and with its source's without a read-back.
WRITE_ALGORITHM: Final = "CRC64NVME"
PART_MEMBER: Final = "ChecksumCRC64NVME"  # an UploadPart answer's, listed again at completion

_MD5 = re.compile(r"[0-9a-f]{32}")
# manifest name, HeadObject member, listing's algorithm name, bytes of the value
_COMPARABLE = (
    ("sha256", "ChecksumSHA256", "SHA256", 32),
    ("crc32c", "ChecksumCRC32C", "CRC32C", 4),
    ("crc64nvme", "ChecksumCRC64NVME", "CRC64NVME", 8),
)
_ALWAYS_FULL = frozenset({"CRC64NVME"})


def head_checksums(head: Mapping[str, Any]) -> dict[str, str]:
    """Fingerprints of a HeadObject answer. A plain ETag is the MD5 unless KMS or a
    customer key encrypted the object. A SHA-256 or CRC32C counts only when it covers the
    whole object: FULL_OBJECT said outright, or no type and a single-part ETag (some
    servers, moto among them, send a multipart object's composite value with no "-N").
    A CRC64NVME always covers it, whatever type a server labels it with (moto labels a
    copy of a multipart object COMPOSITE). A value of the wrong length for its algorithm
    is no such checksum (moto without awscrt passes a CRC32 off as a CRC64NVME)."""
    found: dict[str, str] = {}
    etag = str(head.get("ETag") or "").strip('"')
    if etag:
        found["etag"] = etag
    encrypted = head.get("SSECustomerAlgorithm") or head.get("ServerSideEncryption") in (
        "aws:kms",
        "aws:kms:dsse",
    )
    if _MD5.fullmatch(etag) and not encrypted:
        found["md5"] = etag
    checksum_type = head.get("ChecksumType")
    full = checksum_type == "FULL_OBJECT" or (checksum_type is None and "-" not in etag)
    for name, member, algorithm, size in _COMPARABLE:
        value = head.get(member)
        if not value or "-" in value or not (full or algorithm in _ALWAYS_FULL):
            continue
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(raw) == size:
            found[name] = raw.hex()
    return found


def worth_a_head(entry: Mapping[str, Any]) -> bool:
    """Whether a listed object may carry a checksum head_checksums would keep: CRC64NVME
    always; SHA-256 or CRC32C unless the listing says COMPOSITE (servers that list no type
    are asked, and the HeadObject's type decides)."""
    algorithms = set(entry.get("ChecksumAlgorithm") or ())
    if algorithms & _ALWAYS_FULL:
        return True
    if not algorithms & {algorithm for _, _, algorithm, _ in _COMPARABLE}:
        return False
    return entry.get("ChecksumType") != "COMPOSITE"


def write_args(mode: ChecksumMode, *, multipart: bool = False) -> dict[str, str]:
    """What a PutObject, CopyObject or CreateMultipartUpload (`multipart`) adds so that S3
    keeps a full-object CRC64NVME of what it stores. Nothing on a `when_required` tier: an
    S3-compatible store there may refuse checksum headers it does not know."""
    if mode != "when_supported":
        return {}
    args = {"ChecksumAlgorithm": WRITE_ALGORITHM}
    if multipart:
        args["ChecksumType"] = "FULL_OBJECT"
    return args


def with_checksums(
    calls: S3Calls, directory: str, listed: Sequence[tuple[ObjectInfo, Mapping[str, Any]]]
) -> list[ObjectInfo]:
    """`listed` (infos keyed relative to `directory`, with their listing entries), each
    object the listing says has a comparable checksum completed by a HeadObject, in
    parallel. An object gone or rewritten since it was listed (another ETag or size)
    keeps what the listing said: its checksum would describe other bytes."""

    def completed(info: ObjectInfo) -> ObjectInfo:
        head = calls._head(directory + info.key)
        if head is None:
            return info
        found = head_checksums(head)
        same = found.get("etag") == info.checksums.get("etag") and int(
            head.get("ContentLength", -1)
        ) == int(info.size_bytes)
        return info._replace(checksums={**info.checksums, **found}) if same else info

    asked = (partial(completed, info) for info, entry in listed if worth_a_head(entry))
    answered = {info.key: info for info in calls._in_parallel(asked)}
    return [answered.get(info.key, info) for info, _ in listed]
