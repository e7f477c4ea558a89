"""The objects of a ListObjectsV2 page read by one regular expression, not an XML tree.

Building an ElementTree of a page of 1,000 objects (eight elements each) took about
6.5 ms of CPU, with the GIL held: a third of what listing a million objects cost this
process, in the threads that read the pages ahead of an import. Every server writes an
object's elements in the order S3's model gives them, so one expression reads them
(about 0.6 ms a page) and the XML parser is left the rest of the page, a few elements.

It is all or nothing per page: unless every `<Contents>` of the page matches (an element
this does not know, a self-closed or nested one, a comment, CDATA, an entity beyond XML's
own), the page is parsed whole as before, so the answer is always the one botocore's
own parser gives.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_CONTENTS = re.compile(
    rb"<Contents>\s*<Key>([^<]*)</Key>\s*<LastModified>([^<]*)</LastModified>\s*"
    rb"<ETag>([^<]*)</ETag>\s*((?:<ChecksumAlgorithm>[^<]*</ChecksumAlgorithm>\s*)*)"
    rb"(?:<ChecksumType>([^<]*)</ChecksumType>\s*)?<Size>([0-9]+)</Size>\s*"
    rb"(?:<StorageClass>([^<]*)</StorageClass>\s*)?</Contents>"
)
_ALGORITHM = re.compile(rb"<ChecksumAlgorithm>([^<]*)</ChecksumAlgorithm>")
# a UTF-8 page (XML's default, and S3's); any other declared encoding is parsed whole
_PROLOG = re.compile(
    rb'\s*(?:<\?xml version="1\.0"(?: encoding="(?i:utf-8)")?\s*\?>\s*)?<ListBucketResult[\s>]'
)
# control characters XML does not allow: the XML parser refuses such a page, as before
_NOT_XML = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_ENTITY = re.compile(rb"&(?:(amp|lt|gt|quot|apos)|#([0-9]+)|#x([0-9a-fA-F]+));")
_NAMED = {b"amp": "&", b"lt": "<", b"gt": ">", b"quot": '"', b"apos": "'"}

Raw = tuple[bytes | None, ...]  # one object's element texts, as matched


def split(body: bytes) -> tuple[bytes, list[Raw]] | None:
    """(the page without its objects, each object's texts), or None when any object
    does not match: the page is then parsed whole."""
    expected = body.count(b"<Contents>")
    if not expected or not _PROLOG.match(body) or _NOT_XML.search(body):
        return None
    rest: list[bytes] = []
    found: list[Raw] = []
    at = 0
    for match in _CONTENTS.finditer(body):
        rest.append(body[at : match.start()])
        found.append(match.groups())
        at = match.end()
    if len(found) != expected:
        return None
    rest.append(body[at:])
    return b"".join(rest), found


def entries(found: list[Raw], timestamp: Callable[[str], Any]) -> list[dict[str, Any]]:
    """The objects as botocore's parser gives them. Raises ValueError for a text XML
    would read differently than its bytes say (the caller parses the page whole)."""
    out = []
    for key, modified, etag, algorithms, checksum_type, size, storage_class in found:
        assert key is not None and modified is not None and etag is not None
        assert size is not None
        entry: dict[str, Any] = {
            "Key": _text(key),
            "LastModified": timestamp(_text(modified)),
            "ETag": _text(etag),
        }
        if algorithms:
            entry["ChecksumAlgorithm"] = [_text(a) for a in _ALGORITHM.findall(algorithms)]
        if checksum_type is not None:
            entry["ChecksumType"] = _text(checksum_type)
        entry["Size"] = int(size)
        if storage_class is not None:
            entry["StorageClass"] = _text(storage_class)
        out.append(entry)
    return out


def _text(value: bytes) -> str:
    """An element's text: XML's five entities and character references decoded; a
    carriage return (which XML turns into a line feed) or any other `&` is refused."""
    if b"&" not in value and b"\r" not in value:
        return value.decode()
    if b"\r" in value or b"&" in _ENTITY.sub(b"", value):
        raise ValueError("an element's text the XML parser reads differently")
    return _ENTITY.sub(_entity, value).decode()


def _entity(match: re.Match[bytes]) -> bytes:
    named, decimal, hexadecimal = match.groups()
    if named is not None:
        return _NAMED[named].encode()
    code = int(decimal) if decimal is not None else int(hexadecimal, 16)
    if not _xml_char(code):
        raise ValueError(f"&#{code}; is no XML character")
    return chr(code).encode()


def _xml_char(code: int) -> bool:
    return (
        code in (0x9, 0xA, 0xD)
        or 0x20 <= code <= 0xD7FF
        or 0xE000 <= code <= 0xFFFD
        or 0x10000 <= code <= 0x10FFFF
    )
