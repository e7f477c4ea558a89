"""Listing a large prefix in key order, faster than one request after another.

ListObjectsV2 hands out a page of 1,000 keys per request, and each page's continuation
token comes with the page before it, so a plain listing of a million objects is a
thousand requests in a row: on a store that answers a page in 100 ms, a hundred seconds
in which the importer mostly waits. But keys are ordered, and a `Delimiter="/"` request
says what a level holds: its objects and its common prefixes (a tree's run directories,
say), each of which can be listed on its own, at the same time as the others. Every key
under a common prefix sorts between that prefix and the level's next entry, so handing
out each prefix's pages in the level's order gives exactly the order of one listing.

A reader thread lists each prefix, at most a couple of pages ahead of the caller, so
memory holds a few pages per reader whatever the tree's size. Narrow prefixes rather
than `StartAfter` ranges, because S3-compatible servers over a file system (rclone's)
walk a prefix from its start for every page: a range deep inside a wide prefix costs
several times the same page at the start of a narrow one.

A listing that fits in one page costs that one request; prefixes are only looked into
once the first page says there is more, and a level too wide for one Delimiter page is
listed whole (with its pages still read ahead).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

LIST_PAGE = 1000  # ListObjectsV2's own maximum
LEVEL_PAGE = 1000  # entries of one Delimiter request: a wider level is listed whole
RANGES = 32  # prefixes enough to keep the readers busy: look no deeper
READERS = 4  # prefixes listed at once
PAGES_AHEAD = 2  # pages a prefix's reader holds before the caller takes them
DISCOVERY_REQUESTS = 32  # Delimiter requests spent looking into levels
SPREAD = 4  # a level is not cut into more than SPREAD * RANGES prefixes

Entry = Mapping[str, Any]  # one object of a page, as botocore parses it
# ListObjectsV2's arguments (Bucket aside) -> its answer; retried by the caller
ListCall = Callable[[dict[str, Any]], Mapping[str, Any]]

_END = object()  # a reader's last word on its prefix
_WHOLE = object()  # a prefix planned to be listed whole


@dataclass(frozen=True, slots=True)
class Part:
    """A stretch of the listing in key order: objects a Delimiter request already
    returned (`entries`), or everything under `prefix` after the full key `after`."""

    prefix: str | None = None
    after: str | None = None
    entries: tuple[Entry, ...] = ()


def ordered_pages(
    list_call: ListCall,
    directory: str,
    start_after: str | None = None,
    *,
    readers: int = READERS,
) -> Iterator[Sequence[Entry]]:
    """Every object under `directory` after the full key `start_after`, page by page in
    key order, with up to `readers` prefixes listed at once."""
    args: dict[str, Any] = {"Prefix": directory, "MaxKeys": LIST_PAGE}
    if start_after:
        args["StartAfter"] = start_after
    first = list_call(args)
    contents: list[Entry] = list(first.get("Contents", []))
    if contents:
        yield contents
    if not first.get("IsTruncated") or not first.get("NextContinuationToken"):
        return
    after = contents[-1]["Key"] if contents else start_after
    yield from _in_order(list_call, plan(list_call, directory, after), max(1, readers))


def plan(list_call: ListCall, directory: str, after: str | None) -> list[Part]:
    """The listing of `directory` after `after`, cut at common prefixes: a level deeper
    while there are fewer than RANGES of them, within DISCOVERY_REQUESTS requests."""
    # (key, entry): an object; (prefix, None): a prefix to look into; (prefix, WHOLE): one
    # to list whole (too wide to look into, or out of requests)
    items: list[tuple[str, object]] = [(directory, None)]
    spent = 0
    prefixes = 1
    while any(entry is None for _, entry in items):
        expanded: list[tuple[str, object]] = []
        for key, entry in items:
            if entry is not None:
                expanded.append((key, entry))
                continue
            if prefixes >= RANGES or spent == DISCOVERY_REQUESTS or _before(key, after):
                expanded.append((key, _WHOLE))
                continue
            answer = list_call({"Prefix": key, "Delimiter": "/", "MaxKeys": LEVEL_PAGE})
            spent += 1
            below = [str(p["Prefix"]) for p in answer.get("CommonPrefixes", [])]
            if answer.get("IsTruncated") or prefixes + len(below) > SPREAD * RANGES:
                expanded.append((key, _WHOLE))  # too wide: hundreds of tiny listings
                continue
            level: list[tuple[str, object]] = [(e["Key"], e) for e in answer.get("Contents", [])]
            level += [(prefix, None) for prefix in below]
            prefixes += len(below) - 1
            expanded += sorted(level, key=lambda item: item[0])
        items = expanded
    return _parts(items, after)


def _before(prefix: str, after: str | None) -> bool:
    """Every key under `prefix` lies at or before `after`."""
    return after is not None and prefix < after and not after.startswith(prefix)


def _parts(items: list[tuple[str, object]], after: str | None) -> list[Part]:
    parts: list[Part] = []
    objects: list[Entry] = []
    for key, entry in items:
        if entry is None or entry is _WHOLE:
            if _before(key, after):
                continue
            if objects:
                parts.append(Part(entries=tuple(objects)))
                objects = []
            within = after if after is not None and after.startswith(key) else None
            parts.append(Part(prefix=key, after=within))
        elif after is None or key > after:
            objects.append(entry)  # type: ignore[arg-type]
    if objects:
        parts.append(Part(entries=tuple(objects)))
    return parts


def _in_order(list_call: ListCall, parts: list[Part], readers: int) -> Iterator[Sequence[Entry]]:
    """The parts' pages, part after part."""
    stop = threading.Event()
    queues: list[queue.Queue[object] | None] = []
    pool = ThreadPoolExecutor(readers, thread_name_prefix="s3-list")
    try:
        for part in parts:
            if part.prefix is None:
                queues.append(None)
                continue
            out: queue.Queue[object] = queue.Queue(PAGES_AHEAD)
            pool.submit(_read_part, list_call, part, out, stop)
            queues.append(out)
        for part, found in zip(parts, queues, strict=True):
            if found is None:
                yield part.entries
                continue
            while (item := found.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
    finally:
        stop.set()  # readers still running give up at their next page
        pool.shutdown(wait=True, cancel_futures=True)


def _read_part(
    list_call: ListCall, part: Part, out: queue.Queue[object], stop: threading.Event
) -> None:
    """List one prefix into `out`, ending with _END or the exception that stopped it."""
    args: dict[str, Any] = {"Prefix": part.prefix, "MaxKeys": LIST_PAGE}
    if part.after is not None:
        args["StartAfter"] = part.after
    try:
        while not stop.is_set():
            answer = list_call(args)
            contents = answer.get("Contents", [])
            if contents and not _put(out, contents, stop):
                return
            token = answer.get("NextContinuationToken")
            if not answer.get("IsTruncated") or not token:
                break
            args["ContinuationToken"] = token
        _put(out, _END, stop)
    except BaseException as error:  # the caller raises it when it reaches this range
        _put(out, error, stop)


def _put(out: queue.Queue[object], item: object, stop: threading.Event) -> bool:
    """Wait for room in `out` unless the caller has stopped listening."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False
