"""ListObjectsV2 answers parsed at a fraction of botocore's cost, to the same dict.

botocore parses an XML answer by walking the operation's model for every element: for a
page of 1,000 objects that is about 35 ms of this process's CPU, so listing the million
objects of a large import cost half a minute of CPU on parsing alone, the largest share
of an S3 import once its reads went through obstore. Here the model is walked once per
output shape, into a tree of small parsing functions, and a page is then parsed by
looking each element's tag up in a dict: the same result, several times faster.

Only what such listings hold is compiled: structures, flattened and wrapped lists, and
strings, numbers, booleans and timestamps. Any other shape (a map, a blob, an XML
attribute) leaves the operation to botocore's own parser, as does a page this parser
cannot read; the result is then botocore's, not a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar
from xml.etree import ElementTree

from botocore import handlers
from botocore.model import Shape, StructureShape
from botocore.parsers import ResponseParserFactory, RestXMLParser
from botocore.session import Session as BotocoreSession

from app.storage.s3 import listing_contents

Parse = Callable[[ElementTree.Element], Any]
FAST_SHAPES = frozenset({"ListObjectsV2Output"})
FAST_OPERATIONS = frozenset({"ListObjectsV2"})
PARSED = "ckpt_parsed_root"  # where check_200 leaves the page it parsed, for the parser
OBJECTS = "ckpt_listed_objects"  # and the page's objects, when read apart (listing_contents)


class _Unsupported(Exception):
    """A shape this parser does not compile: botocore parses it."""


def _tag(element: ElementTree.Element) -> str:
    tag = element.tag
    return tag[tag.index("}") + 1 :] if tag[:1] == "{" else tag


def _text(element: ElementTree.Element) -> str:
    return element.text or ""  # <a></a> is "", as botocore has it


def _compile(shape: Shape, timestamp: Callable[[str], Any]) -> Parse:
    kind = shape.type_name
    if kind == "structure":
        assert isinstance(shape, StructureShape)
        return _structure(shape, timestamp)
    if kind == "list":
        item = _compile(shape.member, timestamp)  # type: ignore[attr-defined]
        return lambda element: [item(child) for child in element]
    if kind in ("string", "character"):
        return _text
    if kind in ("integer", "long"):
        return lambda element: int(_text(element))
    if kind == "boolean":
        return lambda element: _text(element) == "true"
    if kind == "timestamp":
        return lambda element: timestamp(_text(element))
    raise _Unsupported(kind)


def _structure(shape: StructureShape, timestamp: Callable[[str], Any]) -> Parse:
    """Members by their element's tag: (name, parse, flattened list)."""
    members: dict[str, tuple[str, Parse, bool]] = {}
    for name, member in shape.members.items():
        serialization = member.serialization
        if serialization.get("location") or serialization.get("eventheader"):
            continue  # a header, parsed by botocore around the payload
        if serialization.get("xmlAttribute"):
            raise _Unsupported("xmlAttribute")
        flat = member.type_name == "list" and bool(serialization.get("flattened"))
        if flat:
            inner = member.member  # type: ignore[attr-defined]
            tag = inner.serialization.get("name") or serialization.get("name") or name
            members[tag] = (name, _compile(inner, timestamp), True)
        else:
            members[serialization.get("name") or name] = (name, _compile(member, timestamp), False)

    by_tag: dict[str, tuple[str, Parse, bool] | None] = {}  # the same, by namespaced tag

    def parse(element: ElementTree.Element) -> dict[str, Any]:
        parsed: dict[str, Any] = {}
        for child in element:
            tag = child.tag
            try:
                found = by_tag[tag]
            except KeyError:
                found = by_tag[tag] = members.get(_tag(child))
            if found is None:
                continue
            name, parse_member, flat = found
            if flat:
                parsed.setdefault(name, []).append(parse_member(child))
            elif name in parsed:
                raise _Unsupported(f"{name} twice")  # botocore's own rules apply
            else:
                parsed[name] = parse_member(child)
        return parsed

    return parse


class ListingParser(RestXMLParser):
    """botocore's rest-xml parser, with FAST_SHAPES' payloads parsed by compiled code."""

    _compiled: ClassVar[dict[str, Parse | None]] = {}  # by output shape's name

    def _parse_payload(
        self,
        response: dict[str, Any],
        shape: Shape,
        member_shapes: dict[str, Shape],
        final_parsed: dict[str, Any],
    ) -> None:
        parse = self._fast(shape) if shape.name in FAST_SHAPES else None
        root = response.pop(PARSED, None)
        objects = response.pop(OBJECTS, None)  # read apart from the page's XML, if they were
        if parse is not None and (root is not None or response.get("body")):
            try:
                if objects is not None:
                    try:
                        parsed = parse(root)
                        timestamp = self._timestamp_parser  # type: ignore[attr-defined]
                        parsed["Contents"] = listing_contents.entries(objects, timestamp)
                        final_parsed.update(parsed)
                        return
                    except (_Unsupported, ValueError):
                        root = None  # the page parsed whole, below
                if root is None:
                    root = ElementTree.fromstring(response["body"])
                final_parsed.update(parse(root))
                return
            except (_Unsupported, ValueError, ElementTree.ParseError):
                pass  # botocore parses it, or says why it cannot
        super()._parse_payload(response, shape, member_shapes, final_parsed)  # type: ignore[misc]

    def _fast(self, shape: Shape) -> Parse | None:
        if shape.name not in self._compiled:
            try:
                timestamp = self._timestamp_parser  # type: ignore[attr-defined]
                compiled: Parse | None = _compile(shape, timestamp)
            except _Unsupported:
                compiled = None
            self._compiled[shape.name] = compiled
        return self._compiled[shape.name]


_BOTOCORE_CHECK: Callable[..., None] = handlers._handle_200_error  # type: ignore[attr-defined]


def check_200(operation_model: Any, response_dict: dict[str, Any], **kwargs: Any) -> None:
    """botocore's check for an error S3 sends with a 200 (the answer is turned into a 500,
    which is retried) parses every answer's XML only to read its root's tag, so a listing
    page was parsed twice. For FAST_OPERATIONS the same check keeps what it parsed for
    ListingParser; every other operation gets botocore's own check."""
    if operation_model.name not in FAST_OPERATIONS:
        _BOTOCORE_CHECK(operation_model, response_dict, **kwargs)
        return
    body = response_dict.get("body")
    if response_dict.get("status_code") != 200 or not body:
        return
    # the page's objects read by listing_contents, the rest of it (a few elements) parsed
    apart = listing_contents.split(body)
    try:
        root = ElementTree.fromstring(apart[0] if apart is not None else body)
    except ElementTree.ParseError:  # a page cut short: retried as a server error
        response_dict["status_code"] = 500
        return
    if root.tag == "Error":
        response_dict["status_code"] = 500
        return
    response_dict[PARSED] = root
    if apart is not None:
        response_dict[OBJECTS] = apart[1]


def install(session: BotocoreSession, timestamp_parser: Callable[[str], Any]) -> None:
    """Have every client `session` builds parse listings here (done before any is built)."""
    factory = ListingParserFactory()
    factory.set_parser_defaults(timestamp_parser=timestamp_parser)
    session.register_component("response_parser_factory", factory)
    events = session.get_component("event_emitter")
    events.unregister("before-parse.s3.*", _BOTOCORE_CHECK)
    events.register_first("before-parse.s3.*", check_200)


class ListingParserFactory(ResponseParserFactory):
    """The factory a botocore session builds its clients' parsers with."""

    def create_parser(self, protocol_name: str) -> Any:
        if protocol_name == "rest-xml":
            return ListingParser(**self._defaults)  # type: ignore[attr-defined]
        return super().create_parser(protocol_name)
