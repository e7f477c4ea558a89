"""A listing page's objects are read by a regular expression rather than an XML tree
(app.storage.s3.listing_contents): the answer must be botocore's own, for every page a
server can send, whether the expression reads it or hands it back to the XML parser."""

from __future__ import annotations

from typing import Any, cast
from xml.sax.saxutils import escape

import botocore.parsers
import botocore.session
from botocore.model import Shape
from hypothesis import given, settings
from hypothesis import strategies as st

from app.storage.s3 import listing_contents
from app.storage.s3.adapter import _UNSAFE_SEGMENT
from app.storage.s3.client import _parse_timestamp
from app.storage.s3.listing_parser import OBJECTS, ListingParserFactory, check_200

OPERATION = botocore.session.get_session().get_service_model("s3").operation_model("ListObjectsV2")
_factory = ListingParserFactory()
_factory.set_parser_defaults(timestamp_parser=_parse_timestamp)
OUTPUT = cast(Shape, OPERATION.output_shape)
OURS = _factory.create_parser("rest-xml")
PLAIN = botocore.parsers.create_parser("rest-xml")

texts = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from("&<>\"' \t\n"),
    max_size=12,
)
spaces = st.sampled_from(["", "\n    ", " ", "\n"])


@st.composite
def escaped(draw: st.DrawFn, value: str) -> str:
    """`value` as a server may write it: entities, or a character reference now and then."""
    out = escape(value, {'"': "&quot;", "'": "&apos;"})
    if value and draw(st.booleans()):
        at = draw(st.integers(0, len(value) - 1))
        out = escape(value[:at]) + f"&#{ord(value[at])};" + escape(value[at + 1 :])
    return out


@st.composite
def an_object(draw: st.DrawFn) -> str:
    gap = draw(spaces)

    def element(tag: str, value: str) -> str:
        text = draw(escaped(value)) if tag in ("Key", "ETag") else escape(value)
        return f"<{tag}>{text}</{tag}>{gap}"

    parts = [
        element("Key", draw(texts)),
        element("LastModified", "2026-12-05T17:04:41.866Z"),
        element("ETag", f'"{draw(st.text("0123456789abcdef", min_size=1, max_size=8))}"'),
    ]
    for algorithm in draw(st.lists(st.sampled_from(["CRC32", "CRC64NVME", "SHA256"]), max_size=2)):
        parts.append(element("ChecksumAlgorithm", algorithm))
    if draw(st.booleans()):
        parts.append(element("ChecksumType", draw(st.sampled_from(["FULL_OBJECT", "COMPOSITE"]))))
    parts.append(element("Size", str(draw(st.integers(0, 2**40)))))
    # now and then what the expression does not read (then the page is parsed whole)
    extra = draw(st.sampled_from(["owner", "restore", "comment", "closed", *[""] * 12]))
    if extra == "owner":  # not read by the expression: the page is parsed whole
        parts.append(
            f"<Owner><ID>o</ID><DisplayName>{draw(escaped(draw(texts)))}</DisplayName></Owner>"
        )
    elif extra == "restore":
        parts.append(
            "<RestoreStatus><IsRestoreInProgress>true</IsRestoreInProgress></RestoreStatus>"
        )
    elif extra == "comment":
        parts.insert(1, "<!-- a comment -->")
    if extra == "closed":
        parts.append("<StorageClass/>")
    elif draw(st.booleans()):
        parts.append(element("StorageClass", draw(st.sampled_from(["STANDARD", "GLACIER_IR"]))))
    return f"<Contents>{gap}{''.join(parts)}</Contents>{gap}"


@st.composite
def a_page(draw: st.DrawFn) -> bytes:
    objects = "".join(draw(st.lists(an_object(), max_size=6)))
    prefixes = "".join(
        f"<CommonPrefixes><Prefix>{draw(escaped(p))}</Prefix></CommonPrefixes>"
        for p in draw(st.lists(texts, max_size=2))
    )
    truncated = draw(st.booleans())
    token = "<NextContinuationToken>t0k3n</NextContinuationToken>" if truncated else ""
    declaration = draw(st.sampled_from(['<?xml version="1.0" encoding="UTF-8"?>\n', ""]))
    page = (
        f'{declaration}<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>b</Name><Prefix></Prefix><KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys>"
        f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{token}"
        f"{objects}{prefixes}</ListBucketResult>"
    )
    return page.encode()


def parsed_ours(body: bytes) -> tuple[dict[str, Any], bool]:
    """What the service's client makes of a page, and whether its objects were read apart."""
    response = {"body": body, "headers": {}, "status_code": 200}
    check_200(OPERATION, response)
    apart = OBJECTS in response
    found = OURS.parse(response, OUTPUT)
    found.pop("ResponseMetadata", None)
    return found, apart


def parsed_by_botocore(body: bytes) -> dict[str, Any]:
    response = {"body": body, "headers": {}, "status_code": 200}
    found: dict[str, Any] = PLAIN.parse(response, OUTPUT)
    found.pop("ResponseMetadata", None)
    return found


@settings(max_examples=400, deadline=None)
@given(a_page())
def test_a_page_parses_to_what_botocore_gives(body: bytes) -> None:
    assert parsed_ours(body)[0] == parsed_by_botocore(body)


def test_a_plain_page_is_read_by_the_expression() -> None:
    """As rclone and moto write their pages: the fast path is the one taken."""
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="x">'
        b"<IsTruncated>false</IsTruncated>"
        b"<Contents>\n  <Key>a&amp;b/c</Key>\n  <LastModified>2026-12-05T17:04:41.866Z"
        b"</LastModified>\n  <ETag>&quot;0f&quot;</ETag>\n  <Size>12</Size>\n"
        b"  <StorageClass>STANDARD</StorageClass>\n</Contents>\n</ListBucketResult>"
    )
    found, apart = parsed_ours(body)
    assert apart
    assert found == parsed_by_botocore(body)
    assert [(o["Key"], o["ETag"], o["Size"]) for o in found["Contents"]] == [("a&b/c", '"0f"', 12)]


def test_a_page_cut_short_is_still_a_server_error_to_retry() -> None:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="x">'
        b"<Contents><Key>a</Key><LastModified>2026-12-05T17:04:41.866Z</LastModified>"
        b"<ETag>e</ETag><Size>1</Size></Contents>"
    )
    response = {"body": body, "headers": {}, "status_code": 200}
    check_200(OPERATION, response)
    assert response["status_code"] == 500


def test_a_control_character_xml_forbids_is_a_server_error_as_before() -> None:
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="x">'
        b"<Contents><Key>a\x01b</Key><LastModified>2026-12-05T17:04:41.866Z</LastModified>"
        b"<ETag>e</ETag><Size>1</Size></Contents></ListBucketResult>"
    )
    assert listing_contents.split(body) is None
    response = {"body": body, "headers": {}, "status_code": 200}
    check_200(OPERATION, response)
    assert response["status_code"] == 500


def test_an_unknown_entity_or_a_carriage_return_leaves_the_page_to_the_xml_parser() -> None:
    for text in (b"a&nbsp;b", b"a\rb", b"&#0;"):
        raw = (text, b"2026-12-05T17:04:41.866Z", b"e", b"", None, b"1", None)
        try:
            listing_contents.entries([raw], _parse_timestamp)
        except ValueError:
            continue
        raise AssertionError(f"{text!r} was read as text")


@given(
    st.lists(
        st.sampled_from(["", ".", "..", "...", "a", ".a", "a.", "b..c"]), min_size=1, max_size=5
    )
)
def test_a_listed_key_is_unsafe_exactly_when_a_segment_is_empty_or_dots(
    segments: list[str],
) -> None:
    """The listing's one search per object says what splitting the key would."""
    key = "/".join(segments)
    expected = any(part in ("", ".", "..") for part in key.split("/"))
    assert bool(_UNSAFE_SEGMENT.search(key)) == expected
