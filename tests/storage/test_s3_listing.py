"""A large S3 listing is cut at common prefixes and read by several threads at once, yet
hands out exactly what one listing in key order would, and resumes after any key: what
an import of a million objects relies on. Against moto and `rclone serve s3`, with the
page size and the number of cuts turned down so that a few dozen objects make many pages
and many prefixes, as a million do."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.storage.s3 import S3Storage
from app.storage.s3 import listing as s3_listing
from tests.storage.s3_servers import (
    S3Endpoint,
    new_bucket,
    s3_client,
)
from tests.storage.test_s3 import Calls

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Names whose order is easy to get wrong: '-' and '.' sort before '/', '0' after it, so
# `a-b/c` < `a.txt` < `a/x` < `a0`: the objects of a level lie between its prefixes.
TREE = [
    "a-b/c",
    "a.txt",
    "a/x",
    "a/y/z",
    "a0",
    *(f"runs/r{r}/config.yaml" for r in range(4)),
    *(
        f"runs/r{r}/checkpoints/step-{s}/part-{p}"
        for r in range(4)
        for s in range(3)
        for p in range(2)
    ),
    "runs/r1-old/step-1/part-0",
    "runs/r1.txt",
    "runs/zz/deep/er/still/x",
    "z",
]


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_listing, "LIST_PAGE", 3)
    monkeypatch.setattr(s3_listing, "RANGES", 4)


def arrange(endpoint: S3Endpoint, keys: list[str]) -> tuple[S3Storage, S3Client]:
    bucket = new_bucket(endpoint)
    raw = s3_client(endpoint)
    for key in keys:
        raw.put_object(Bucket=bucket, Key=f"tier/t/{key}", Body=b"k")
    raw.put_object(Bucket=bucket, Key="tier/t0/not-under-t", Body=b"k")
    storage = S3Storage(bucket, "tier", endpoint_url=endpoint.url, concurrency=3)
    return storage, raw


def listed(storage: S3Storage, start_after: str | None = None) -> list[str]:
    return [info.key for info in storage.iter_prefix("t", start_after=start_after)]


def s3_list_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("s3-list")]


@pytest.mark.usefixtures("small_pages")
def test_a_cut_listing_is_one_listing_in_key_order(either_s3: S3Endpoint) -> None:
    storage, _ = arrange(either_s3, TREE)
    calls = Calls(storage, "ListObjectsV2")
    senders: set[str] = set()
    storage.client.meta.events.register(
        "before-call.s3.ListObjectsV2",
        lambda **_: senders.add(threading.current_thread().name),
    )
    expected = sorted(TREE)
    assert listed(storage) == expected
    # the first page, Delimiter requests, then more requests than one listing's pages: the
    # tree was cut into prefixes, each listed on its own, by more than one reader
    plain_pages = -(-len(TREE) // 3)
    assert calls["ListObjectsV2"] > plain_pages
    assert len({name for name in senders if name.startswith("s3-list")}) > 1
    assert not s3_list_threads()


@pytest.mark.usefixtures("small_pages")
def test_a_cut_listing_resumes_after_any_key(either_s3: S3Endpoint) -> None:
    """After every listed key, and after keys that are no object's (a prefix, a gap)."""
    storage, _ = arrange(either_s3, TREE)
    expected = sorted(TREE)
    for at, key in enumerate(expected):
        assert listed(storage, key) == expected[at + 1 :], key
    for between in ("a/", "runs/", "runs/r1/", "runs/r1/checkpoints/step-1/", "runs/r2", "y"):
        assert listed(storage, between) == [k for k in expected if k > between], between


@pytest.mark.usefixtures("small_pages")
def test_a_level_too_wide_for_one_request_is_listed_whole(
    moto_s3: S3Endpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(s3_listing, "LEVEL_PAGE", 2)  # the tree's root holds six entries
    storage, _ = arrange(moto_s3, TREE)
    assert listed(storage) == sorted(TREE)
    assert listed(storage, "a/x") == [k for k in sorted(TREE) if k > "a/x"]


@pytest.mark.usefixtures("small_pages")
def test_a_caller_that_stops_early_leaves_no_reader_behind(moto_s3: S3Endpoint) -> None:
    storage, _ = arrange(moto_s3, TREE)
    pages: Generator[str, None, None] = (info.key for info in storage.iter_prefix("t"))
    taken = [next(pages) for _ in range(8)]
    assert taken == sorted(TREE)[:8]
    pages.close()  # an import stopped by shutdown
    assert not s3_list_threads()


@pytest.mark.usefixtures("small_pages")
def test_a_failing_prefix_fails_the_listing_when_reached(moto_s3: S3Endpoint) -> None:
    """A reader's error surfaces in order, after everything listed before its prefix."""
    storage, raw = arrange(moto_s3, TREE)
    seen: list[str] = []
    failing = "tier/t/runs/r2/"

    def refuse(params: dict[str, object], **_: object) -> None:
        if params.get("Prefix") == failing and "Delimiter" not in params:
            raise RuntimeError("the store refused runs/r2/")

    storage.client.meta.events.register("provide-client-params.s3.ListObjectsV2", refuse)
    with pytest.raises(RuntimeError, match="refused runs/r2/"):
        for info in storage.iter_prefix("t"):
            seen.append(info.key)
    assert seen == [k for k in sorted(TREE) if k < "runs/r2/"]
    assert not s3_list_threads()
    assert raw is not None


names = st.text(alphabet="ab-./0", min_size=1, max_size=3).filter(
    lambda n: n not in (".", "..") and "/" not in n
)
keys = st.lists(
    st.lists(names, min_size=1, max_size=4).map("/".join), min_size=1, max_size=25, unique=True
).filter(lambda ks: not any(a != b and b.startswith(a + "/") for a in ks for b in ks))


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(tree=keys, data=st.data())
@pytest.mark.usefixtures("small_pages")
def test_any_tree_lists_in_key_order_and_resumes(
    moto_s3: S3Endpoint,
    tree: list[str],
    data: st.DataObject,
) -> None:
    storage, _ = arrange(moto_s3, tree)
    expected = sorted(tree)
    assert listed(storage) == expected
    after = data.draw(st.sampled_from(expected))
    assert listed(storage, after) == [k for k in expected if k > after]
