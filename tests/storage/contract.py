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

import pytest

from app.storage.base import ObjectMissing, Storage, StorageError, UnsafePath
from app.storage.local import LocalStorage
from app.storage.transfer import bytes_through, copy_files, verify_files

MiB = 1024 * 1024
Factory = Callable[[], Storage]


def put(storage: Storage, key: str, data: bytes) -> None:
    storage.upload(key, io.BytesIO(data), len(data))


def read(storage: Storage, key: str) -> bytes:
    with storage.open_read(key) as stream:
        return stream.read()


def payload(n: int, seed: str = "x") -> bytes:
    block = hashlib.sha256(seed.encode()).digest()
    return (block * (n // len(block) + 1))[:n]


class StorageContract:
    """The tests every adapter passes; subclasses provide `make`."""

    @pytest.fixture
    def make(self) -> Factory:
        """A factory of fresh, empty storages of one adapter (each under its own root)."""
        raise NotImplementedError

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
