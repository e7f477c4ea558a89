"""Two tiers, `hot` and `cold`, of one kind (local directories, S3 on moto, GCS on
fake-gcs-server), with a way to write and read their objects that does not go through the
service: what the tests see is what the provider holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs

from app.settings import Settings
from tests.builders import with_tiers
from tests.storage.gcs_server import GcsEndpoint
from tests.storage.gcs_server import new_bucket as new_gcs_bucket
from tests.storage.s3_servers import S3Endpoint
from tests.storage.s3_servers import new_bucket as new_s3_bucket

KINDS = ("local", "s3", "gcs")


class Store:
    """`hot` and `cold` on one provider; keys are relative to the tier's url."""

    def __init__(
        self,
        kind: str,
        data_dir: Path,
        s3: S3Endpoint | None = None,
        gs: GcsEndpoint | None = None,
    ) -> None:
        self.kind = kind
        self.data_dir = data_dir
        self.buckets: dict[str, str] = {}
        if kind == "s3":
            assert s3 is not None
            self.s3_url = s3.url
            self.s3 = boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1")
            self.buckets = {t: new_s3_bucket(s3, t) for t in ("hot", "cold")}
        elif kind == "gcs":
            assert gs is not None
            self.gcs = gcs.Client(credentials=AnonymousCredentials(), project="test")
            self.buckets = {t: new_gcs_bucket(gs, t) for t in ("hot", "cold")}

    def tiers(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for name in ("hot", "cold"):
            if self.kind == "local":
                out.append({"name": name, "url": f"file://{self.data_dir / name}"})
            elif self.kind == "s3":
                url = f"s3://{self.buckets[name]}/ckpt"
                out.append({"name": name, "url": url, "endpoint_url": self.s3_url})
            else:
                out.append({"name": name, "url": f"gs://{self.buckets[name]}/ckpt"})
        return out

    def settings(self, settings: Settings) -> Settings:
        return with_tiers(settings, self.tiers())

    def uri(self, tier: str, key: str) -> str:
        if self.kind == "local":
            return f"file://{(self.data_dir / tier / key).resolve()}"
        scheme = "s3" if self.kind == "s3" else "gs"
        return f"{scheme}://{self.buckets[tier]}/ckpt/{key}"

    def put(self, tier: str, key: str, data: bytes) -> None:
        if self.kind == "local":
            path = self.data_dir / tier / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        elif self.kind == "s3":
            self.s3.put_object(Bucket=self.buckets[tier], Key=f"ckpt/{key}", Body=data)
        else:
            self.gcs.bucket(self.buckets[tier]).blob(f"ckpt/{key}").upload_from_string(data)

    def write(self, tier: str, key: str, files: dict[str, bytes]) -> str:
        """Write `files` under `key` and return the uri naming that prefix."""
        for path, data in files.items():
            self.put(tier, f"{key}/{path}", data)
        return self.uri(tier, key)

    def objects(self, tier: str) -> dict[str, bytes]:
        """Every object of the tier by its key."""
        if self.kind == "local":
            root = self.data_dir / tier
            if not root.exists():
                return {}
            return {
                str(p.relative_to(root)): p.read_bytes()
                for p in sorted(root.rglob("*"))
                if p.is_file()
            }
        if self.kind == "s3":
            out: dict[str, bytes] = {}
            pages = self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.buckets[tier], Prefix="ckpt/"
            )
            for page in pages:
                for item in page.get("Contents", []):
                    body = self.s3.get_object(Bucket=self.buckets[tier], Key=item["Key"])
                    out[item["Key"].removeprefix("ckpt/")] = body["Body"].read()
            return out
        return {
            blob.name.removeprefix("ckpt/"): blob.download_as_bytes()
            for blob in self.gcs.list_blobs(self.buckets[tier], prefix="ckpt/")
        }

    def under(self, tier: str, key: str) -> dict[str, bytes]:
        """The objects under `key/`, by their path relative to it."""
        return {
            k.removeprefix(key + "/"): v
            for k, v in self.objects(tier).items()
            if k.startswith(key + "/")
        }
