"""The storage contract: what every Storage adapter does, as one abstract test class.

Each adapter's test class (tests/storage/test_contract.py) inherits StorageContract,
provides the `make` fixture, a factory of fresh, empty storages of that adapter, and sets
the capabilities below where adapters (and the test servers behind them) legitimately
differ; every test asserts the documented behaviour for the capabilities declared. pytest
collects only the subclasses: this class's name does not start with "Test".
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import google_crc32c
import pytest
from awscrt.checksums import crc64nvme

from app.storage.base import (
    ArchivedObject,
    ObjectMissing,
    PermanentError,
    Storage,
    StorageError,
    UnsafePath,
)
from app.storage.local import LocalStorage
from app.storage.transfer import bytes_through, copy_files, verify_files

MiB = 1024 * 1024
Factory = Callable[[], Storage]


def put(storage: Storage, key: str, data: bytes) -> None:
    storage.upload(key, io.BytesIO(data), len(data))


def read(storage: Storage, key: str) -> bytes:
    with storage.open_read(key) as stream:
        return stream.read()


def class_of(storage: Storage, key: str) -> str | None:
    info = storage.head(key)
    assert info is not None, f"{key} is missing"
    return info.storage_class


class Trickle:
    """A read-only reader (no tell, seek or seekable) giving at most 100 KiB a read, like a
    stream from another provider."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._inner.read(min(size, 100 * 1024) if size >= 0 else 100 * 1024)


def payload(n: int, seed: str = "x") -> bytes:
    block = hashlib.sha256(seed.encode()).digest()
    return (block * (n // len(block) + 1))[:n]


class StorageContract:
    """The tests every adapter passes; subclasses provide `make` and the capabilities."""

    # -- capabilities ----------------------------------------------------------------------
    # Two storages of `make` copy server-side (same_service) rather than through us.
    server_side_copy: ClassVar[bool]
    # The class head and listings report for an object written with none (None: no classes).
    default_class: ClassVar[str | None]
    # A class other than the default, to write objects in and change them to.
    other_class: ClassVar[str]
    # Where the server keeps a class it is given: "upload", "copy" (copy_within) and "set"
    # (set_storage_class). Elsewhere the object reports the default class.
    classes_kept: ClassVar[frozenset[str]]
    # Whether list_prefix reports a kept class (or the default whatever was kept).
    listings_show_classes: ClassVar[bool]
    # Whether set_storage_class looks the object up (ObjectMissing when there is none) or
    # does nothing at all.
    class_change_looks_up: ClassVar[bool]
    # Whether restore_state and request_restore look the object up (ObjectMissing when there
    # is none) or answer for any key: "readable", nothing to ask for.
    restores_look_up: ClassVar[bool]
    # A class whose objects must be restored before they can be read (None: none must).
    archive_class: ClassVar[str | None]
    # Whether a crashed upload leaves something abort_uploads finds (see leave_unfinished).
    unfinished_uploads: ClassVar[bool]
    # The fingerprints head reports for a small object written by upload.
    fingerprints: ClassVar[frozenset[str]]
    # What copy_within raises for a source of another service (see foreign).
    foreign_copy_error: ClassVar[type[Exception]]

    @pytest.fixture
    def make(self) -> Factory:
        """A factory of fresh, empty storages of one adapter (each under its own root)."""
        raise NotImplementedError

    def leave_unfinished(self, storage: Storage, key: str) -> None:
        """Leave behind at `key` what a crashed upload leaves (when unfinished_uploads)."""
        raise NotImplementedError

    def foreign(self, tmp_path: Path) -> Storage:
        """A storage of another service, which copy_within refuses as a source."""
        return LocalStorage(tmp_path / "foreign")

    def kept(self, operation: str) -> str | None:
        """The class an object written in other_class by `operation` reports."""
        return self.other_class if operation in self.classes_kept else self.default_class

    def test_round_trip_lists_heads_and_reads(self, make: Factory) -> None:
        storage = make()
        files = {"b/shard-1.bin": payload(1000, "1"), "a.json": b"{}", "b/shard-0.bin": b""}
        for path, data in files.items():
            put(storage, f"run/step-1/{path}", data)

        listed = storage.list_prefix("run/step-1")

        assert [(i.key, i.size_bytes) for i in listed] == sorted(
            (path, len(data)) for path, data in files.items()
        )
        assert storage.prefix_exists("run/step-1")
        info = storage.head("run/step-1/b/shard-1.bin")
        assert info is not None and info.size_bytes == 1000
        for path, data in files.items():
            assert read(storage, f"run/step-1/{path}") == data
        assert storage.restore_state("run/step-1/a.json") == "readable"

    def test_a_multipart_sized_object_round_trips(self, make: Factory) -> None:
        storage = make()
        data = payload(12 * MiB + 123, "big")
        put(storage, "big/step-1/blob", data)
        assert read(storage, "big/step-1/blob") == data
        info = storage.head("big/step-1/blob")
        assert info is not None and info.size_bytes == len(data)

    def test_missing_things(self, make: Factory) -> None:
        storage = make()
        with pytest.raises(ObjectMissing):
            storage.list_prefix("nothing/here")
        assert not storage.prefix_exists("nothing/here")
        assert storage.head("nothing/here/x") is None
        with pytest.raises(ObjectMissing):
            storage.open_read("nothing/here/x")
        assert storage.delete_prefix("nothing/here") == 0
        storage.delete_keys(["nothing/here/x"])  # a missing object is deleted already

    def test_upload_replaces_an_object_whole(self, make: Factory) -> None:
        storage = make()
        put(storage, "p/step-1/f", b"old old old")
        put(storage, "p/step-1/f", b"new")
        assert read(storage, "p/step-1/f") == b"new"

    def test_a_short_source_fails_the_upload_and_leaves_nothing(self, make: Factory) -> None:
        storage = make()
        with pytest.raises((StorageError, ValueError)):
            storage.upload("p/step-1/f", io.BytesIO(b"only ten b"), 20)
        assert storage.head("p/step-1/f") is None

    def test_delete_prefix_spares_siblings_that_share_its_start(self, make: Factory) -> None:
        """step-1 is not step-10: deleting one checkpoint never touches another."""
        storage = make()
        for step in ("step-1", "step-10", "step-1x"):
            put(storage, f"run/{step}/a", step.encode())
            put(storage, f"run/{step}/sub/b", step.encode())

        assert storage.delete_prefix("run/step-1") == 2

        assert not storage.prefix_exists("run/step-1")
        assert read(storage, "run/step-10/sub/b") == b"step-10"
        assert read(storage, "run/step-1x/a") == b"step-1x"
        assert storage.delete_prefix("run/step-1") == 0  # repeating it is harmless

    def test_the_root_is_never_deleted(self, make: Factory) -> None:
        storage = make()
        put(storage, "keep/me", b"1")
        with pytest.raises(UnsafePath):
            storage.delete_prefix("")
        assert read(storage, "keep/me") == b"1"

    def test_delete_keys_deletes_exactly_those(self, make: Factory) -> None:
        storage = make()
        for i in range(5):
            put(storage, f"k/{i}", b"x")
        storage.delete_keys(["k/1", "k/3", "k/9"])
        assert [i.key for i in storage.list_prefix("k")] == ["0", "2", "4"]

    def test_copy_files_between_every_pair_and_verify(self, make: Factory, tmp_path: Path) -> None:
        """Into and out of each adapter, against local directories on the other side."""
        local = LocalStorage(tmp_path / "other")
        files = {"a.bin": payload(3000, "a"), "dir/b.bin": payload(5000, "b")}
        manifest = [
            {"path": p, "size_bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()}
            for p, d in sorted(files.items())
        ]
        storage = make()
        for path, data in files.items():
            put(local, f"src/{path}", data)

        copy_files(local, "src", storage, "in", manifest, storage_class=None)
        assert verify_files(storage, "in", manifest) == []
        copy_files(storage, "in", local, "back", manifest, storage_class=None)
        assert verify_files(local, "back", manifest) == []
        assert {p: read(local, f"back/{p}") for p in files} == files

        again = copy_files(local, "src", storage, "in", manifest, storage_class=None)
        assert again.skipped == len(files), "a resumed copy redoes files already verified"

    def test_verification_catches_same_size_other_bytes(self, make: Factory) -> None:
        storage = make()
        good = payload(4000, "good")
        put(storage, "v/f", good[:-1] + bytes([good[-1] ^ 1]))
        entry = {"path": "f", "size_bytes": 4000, "sha256": hashlib.sha256(good).hexdigest()}
        assert verify_files(storage, "v", [entry])
        assert verify_files(storage, "v", [{"path": "f", "size_bytes": 3999}])
        assert verify_files(storage, "v", [{"path": "f", "size_bytes": 4000}]) == []

    def test_same_provider_copies_are_server_side(self, make: Factory) -> None:
        first, second = make(), make()
        data = payload(2 * MiB, "s")
        put(first, "s/step-1/blob", data)
        manifest = [{"path": "blob", "size_bytes": len(data)}]
        before = bytes_through()

        report = copy_files(first, "s/step-1", second, "d/step-1", manifest, storage_class=None)

        if second.same_service(first):
            assert report.bytes_streamed == 0 and bytes_through() == before
            assert report.bytes_server_side == len(data)
        assert read(second, "d/step-1/blob") == data
        assert (
            verify_files(second, "d/step-1", manifest, source=first, source_prefix="s/step-1") == []
        )

    # -- every method of the protocol, capabilities stated --------------------------------

    def test_same_service(self, make: Factory, tmp_path: Path) -> None:
        first, second = make(), make()
        assert first.same_service(second) is self.server_side_copy
        assert second.same_service(first) is self.server_side_copy
        assert not first.same_service(LocalStorage(tmp_path / "elsewhere"))

    def test_a_streamed_listing_is_in_key_order_and_resumes_after_any_key(
        self, make: Factory
    ) -> None:
        """What an import relies on: every store lists `a.txt` before `a/x` (bytes order,
        as a bucket does), and `start_after` any listed key yields exactly the rest."""
        storage = make()
        keys = ["t/a.txt", "t/a/x", "t/a/y/z", "t/a-b/c", "t/a0", "t/b/1", "t/b/10", "t/b/2"]
        for key in keys:
            put(storage, key, b"k")
        put(storage, "other/x", b"not under t")
        listed = [info.key for info in storage.iter_prefix("t")]
        expected = sorted(k.removeprefix("t/") for k in keys)
        assert listed == expected
        for at, key in enumerate(expected):
            rest = [info.key for info in storage.iter_prefix("t", start_after=key)]
            assert rest == expected[at + 1 :], key
        after_a = [k for k in expected if k > "a/"]  # a key that is no object's
        assert [i.key for i in storage.iter_prefix("t", start_after="a/")] == after_a
        assert list(storage.iter_prefix("missing")) == []

    def test_a_small_object_is_read_whole_and_a_larger_one_refused(self, make: Factory) -> None:
        """What an import reads a Trainer's state with, on every store."""
        storage = make()
        state = b'{"log_history": [{"step": 5, "eval_loss": 0.25}]}'
        put(storage, "s/checkpoint-5/trainer_state.json", state)
        assert storage.read_small("s/checkpoint-5/trainer_state.json", len(state)) == state
        assert storage.read_small("s/checkpoint-5/trainer_state.json", 1 << 20) == state
        with pytest.raises(PermanentError, match="more than"):
            storage.read_small("s/checkpoint-5/trainer_state.json", len(state) - 1)
        with pytest.raises(ObjectMissing):
            storage.read_small("s/checkpoint-6/trainer_state.json", 1 << 20)

    def test_listings_say_when_each_object_was_written(self, make: Factory) -> None:
        storage = make()
        put(storage, "w/a", b"a")
        put(storage, "w/sub/b", b"b")
        listed = storage.list_prefix("w")
        assert [i.key for i in listed] == ["a", "sub/b"]
        assert all(i.modified is not None for i in listed)

    def test_head_reports_true_fingerprints(self, make: Factory) -> None:
        storage = make()
        data = payload(5000, "f")
        put(storage, "f/a", data)
        info = storage.head("f/a")
        assert info is not None
        assert set(info.checksums) == self.fingerprints
        true = {
            "md5": hashlib.md5(data).hexdigest(),
            "sha256": hashlib.sha256(data).hexdigest(),
            "crc32c": f"{google_crc32c.value(data):08x}",
            "crc64nvme": f"{crc64nvme(data):016x}",
        }
        assert {n: v for n, v in info.checksums.items() if n in true} == {
            n: true[n] for n in info.checksums if n in true
        }

    def test_open_read_streams_in_pieces(self, make: Factory) -> None:
        storage = make()
        data = payload(3 * MiB + 17, "r")
        put(storage, "r/blob", data)
        with storage.open_read("r/blob") as stream:
            assert b"".join(iter(lambda: stream.read(100_000), b"")) == data

    def test_upload_from_a_reader_that_cannot_seek(self, make: Factory) -> None:
        storage = make()
        data = payload(6 * MiB + 5, "t")  # above an S3 part here: parts read in order
        storage.upload("t/blob", Trickle(data), len(data))  # type: ignore[arg-type]
        assert read(storage, "t/blob") == data

    def test_delete_keys_counts_missing_ones_as_deleted(self, make: Factory) -> None:
        storage = make()
        put(storage, "n/a", b"a")
        assert storage.delete_keys(["n/a", "n/never"]) == 2
        assert storage.head("n/a") is None
        assert storage.delete_keys([]) == 0

    def test_upload_and_copy_in_a_storage_class(self, make: Factory) -> None:
        storage = make()
        put(storage, "u/plain", b"p")
        storage.upload("u/cold", io.BytesIO(b"c"), 1, storage_class=self.other_class)
        storage.copy_within(storage, "u/plain", "u/copy", 1, storage_class=self.other_class)

        assert {key: class_of(storage, f"u/{key}") for key in ("plain", "cold", "copy")} == {
            "plain": self.default_class,
            "cold": self.kept("upload"),
            "copy": self.kept("copy"),
        }
        listed = {info.key: info.storage_class for info in storage.list_prefix("u")}
        shown = self.listings_show_classes
        assert listed == {
            "plain": self.default_class,
            "cold": self.kept("upload") if shown else self.default_class,
            "copy": self.kept("copy") if shown else self.default_class,
        }
        assert read(storage, "u/copy") == b"p"

    def test_set_storage_class_changes_it_in_place(self, make: Factory) -> None:
        storage = make()
        data = payload(2000, "k")
        put(storage, "k/a", data)

        storage.set_storage_class("k/a", self.other_class)
        assert class_of(storage, "k/a") == self.kept("set")
        storage.set_storage_class("k/a", self.other_class)  # nothing to change: harmless
        assert read(storage, "k/a") == data

        if self.class_change_looks_up:
            with pytest.raises(ObjectMissing):
                storage.set_storage_class("k/none", self.other_class)
        else:
            storage.set_storage_class("k/none", self.other_class)
        assert storage.head("k/none") is None

    def test_copy_within(self, make: Factory) -> None:
        first, second = make(), make()
        data = payload(3000, "c")
        put(first, "c/a", data)

        second.copy_within(first, "c/a", "c/b", len(data))

        assert read(second, "c/b") == data
        assert read(first, "c/a") == data
        with pytest.raises(ObjectMissing):
            second.copy_within(first, "c/none", "c/x", 1)
        assert second.head("c/x") is None

    def test_copy_within_refuses_another_service(self, make: Factory, tmp_path: Path) -> None:
        storage = make()
        with pytest.raises(self.foreign_copy_error):
            storage.copy_within(self.foreign(tmp_path), "f/a", "f/b", 1)
        assert storage.head("f/b") is None

    def test_abort_uploads_collects_what_crashed_uploads_left(self, make: Factory) -> None:
        storage = make()
        put(storage, "ck/done", b"1")
        if self.unfinished_uploads:
            self.leave_unfinished(storage, "ck/sub/partial")
            self.leave_unfinished(storage, "ck2/partial")
        left = 1 if self.unfinished_uploads else 0

        assert storage.abort_uploads("ck") == left
        assert storage.abort_uploads("ck") == 0
        assert storage.abort_uploads("ck2") == left  # a sibling sharing its start is spared
        assert storage.abort_uploads("nothing/here") == 0
        assert read(storage, "ck/done") == b"1"

    def test_a_plain_object_is_readable_and_restoring_it_is_harmless(self, make: Factory) -> None:
        storage = make()
        put(storage, "r/a", b"a")
        assert storage.restore_state("r/a") == "readable"
        storage.request_restore("r/a")
        storage.request_restore("r/a", days=2)
        assert storage.restore_state("r/a") == "readable"
        assert read(storage, "r/a") == b"a"

    def test_restores_of_a_missing_object(self, make: Factory) -> None:
        storage = make()
        if self.restores_look_up:
            with pytest.raises(ObjectMissing):
                storage.restore_state("r/none")
            with pytest.raises(ObjectMissing):
                storage.request_restore("r/none")
        else:
            assert storage.restore_state("r/none") == "readable"
            storage.request_restore("r/none")
        assert storage.head("r/none") is None

    def test_an_archived_object_is_read_once_restored(self, make: Factory) -> None:
        storage = make()
        if self.archive_class is None:  # nothing here archives: every class reads at once
            storage.upload("g/cold", io.BytesIO(b"cold"), 4, storage_class=self.other_class)
            assert storage.restore_state("g/cold") == "readable"
            storage.request_restore("g/cold")  # asking anyway is harmless
            assert read(storage, "g/cold") == b"cold"
            return
        storage.upload("g/cold", io.BytesIO(b"cold"), 4, storage_class=self.archive_class)
        with pytest.raises(ArchivedObject):
            storage.open_read("g/cold")
        assert storage.restore_state("g/cold") == "archived"

        storage.request_restore("g/cold", days=2)
        assert storage.restore_state("g/cold") in ("restoring", "readable")
        storage.request_restore("g/cold")  # repeating it is harmless
