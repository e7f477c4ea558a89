"""What a tier's bucket keeps and refuses, stated in the tiers file or read from the
bucket at start (`detect: true`), checked at start and shown by `GET /v1/tiers`.

moto answers GetBucketVersioning and GetObjectLockConfiguration as S3 does;
fake-gcs-server keeps the versioning flag but has neither soft delete nor Autoclass, so
those are read here from a recorded `buckets.get` answer of real GCS."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from fastapi.testclient import TestClient
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs

from app.domain.provider import ObjectLock
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from app.storage.bucket_settings import BucketSettingsError, gcs_settings, merged, s3_settings
from app.tiers_config import TiersFileError, parse_tiers_file
from tests.builders import with_tiers
from tests.storage.gcs_server import GcsEndpoint
from tests.storage.s3_servers import S3Endpoint

# A real GCS bucket's `buckets.get` answer (trimmed): Autoclass on, the default soft delete.
RECORDED_GCS_BUCKET: dict[str, Any] = {
    "kind": "storage#bucket",
    "name": "team-ckpt",
    "storageClass": "STANDARD",
    "versioning": {"enabled": False},
    "autoclass": {"enabled": True, "toggleTime": "2026-03-02T10:11:12.000Z"},
    "softDeletePolicy": {
        "retentionDurationSeconds": "604800",
        "effectiveTime": "2024-03-01T08:00:00.000Z",
    },
}


def tiers_file(tmp_path: Path, **options: Any) -> Path:
    path = tmp_path / "tiers.yaml"
    tier = {"name": "hot", "url": "gs://team-ckpt/ckpt", **options}
    path.write_text(yaml.safe_dump({"tiers": [tier]}))
    return path


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"autoclass": True, "storage_class": "NEARLINE"}, "ignores the class a rewrite asks"),
        ({"object_lock": {"mode": "GOVERNANCE", "retain": "30d"}}, "applies to s3://"),
        ({"keep_versions": True}, "applies to a versioned bucket"),
        ({"versioned": True, "noncurrent_expiry": "30d"}, "applies with keep_versions"),
        ({"soft_delete": "7 days"}, "malformed duration"),
        (
            {
                "url": "s3://vault/ckpt",
                "object_lock": {"mode": "COMPLIANCE", "retain": "30d"},
                "request_checksums": "when_required",
            },
            "object_lock needs request_checksums: when_supported",
        ),
    ],
    ids=[
        "autoclass-with-class",
        "lock-on-gcs",
        "keep-unversioned",
        "expiry-alone",
        "bad-duration",
        "lock-without-checksums",
    ],
)
def test_contradictory_settings_are_refused_naming_the_field(
    tmp_path: Path, options: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(TiersFileError) as caught:
        parse_tiers_file(tiers_file(tmp_path, **options))
    assert fragment in str(caught.value)
    assert "tiers[0]" in str(caught.value)


def test_stated_settings_give_how_long_deleted_bytes_stay_billed(tmp_path: Path) -> None:
    [tier] = parse_tiers_file(tiers_file(tmp_path, soft_delete="7d"))
    assert tier.provider.billed_after_delete == timedelta(days=7)
    assert tier.provider.source == "tiers file"
    [plain] = parse_tiers_file(tiers_file(tmp_path))
    assert plain.provider.billed_after_delete == timedelta(0)
    assert plain.provider.source == "default"
    [forever] = parse_tiers_file(tiers_file(tmp_path, versioned=True, keep_versions=True))
    assert forever.provider.billed_forever


def test_a_recorded_autoclass_bucket_refuses_a_storage_class_at_start(tmp_path: Path) -> None:
    found = gcs_settings(RECORDED_GCS_BUCKET)
    assert found == {"versioned": False, "autoclass": True, "soft_delete": timedelta(days=7)}
    [tier] = parse_tiers_file(tiers_file(tmp_path, detect=True))
    adopted = merged(tier, found)
    assert adopted.provider.soft_delete == timedelta(days=7)
    assert adopted.provider.autoclass and adopted.provider.source == "bucket"
    [classed] = parse_tiers_file(tiers_file(tmp_path, detect=True, storage_class="NEARLINE"))
    with pytest.raises(BucketSettingsError) as caught:
        merged(classed, found)
    assert "Autoclass" in str(caught.value) and "'hot'" in str(caught.value)


def test_a_stated_figure_wins_over_the_buckets(tmp_path: Path) -> None:
    [tier] = parse_tiers_file(tiers_file(tmp_path, detect=True, soft_delete="3d"))
    assert merged(tier, gcs_settings(RECORDED_GCS_BUCKET)).provider.soft_delete == timedelta(days=3)


def test_s3_bucket_settings_are_read_at_start(
    settings: Settings, moto_s3: S3Endpoint, tmp_path: Path
) -> None:
    """A bucket with Object Lock and a default retention: GET /v1/tiers says it versions
    and locks, and that the bucket said so."""
    s3 = boto3.client("s3", endpoint_url=moto_s3.url, region_name="us-east-1")
    locked = f"lk-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=locked, ObjectLockEnabledForBucket=True)
    s3.put_object_lock_configuration(
        Bucket=locked,
        ObjectLockConfiguration={
            "ObjectLockEnabled": "Enabled",
            "Rule": {"DefaultRetention": {"Mode": "COMPLIANCE", "Days": 30}},
        },
    )
    plain = f"pl-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=plain)
    tiers = [
        {"name": n, "url": f"s3://{b}/ckpt", "endpoint_url": moto_s3.url, "detect": True}
        for n, b in (("hot", plain), ("cold", locked))
    ]
    app = create_app(with_tiers(settings, tiers), roles=NO_BACKGROUND)
    with TestClient(app) as client:
        shown = {t["name"]: t["provider"] for t in client.get("/v1/tiers").json()["items"]}
    assert shown["cold"]["versioned"] is True
    assert shown["cold"]["object_lock"] == {"mode": "COMPLIANCE", "retain": "30d"}
    assert shown["cold"]["source"] == "bucket"
    assert shown["hot"]["versioned"] is False and shown["hot"]["object_lock"] is None
    assert s3_settings({"Status": "Suspended"}, None) == {"versioned": True}
    assert app.state.tiers[1].provider.object_lock == ObjectLock("COMPLIANCE", timedelta(days=30))


def test_gcs_versioning_is_read_at_start(
    settings: Settings, fake_gcs: GcsEndpoint, tmp_path: Path
) -> None:
    client = gcs.Client(credentials=AnonymousCredentials(), project="test")
    bucket = client.bucket(f"ver-{uuid.uuid4().hex[:16]}")
    bucket.versioning_enabled = True
    client.create_bucket(bucket)
    tiers = [{"name": "hot", "url": f"gs://{bucket.name}/ckpt", "detect": True}]
    app = create_app(with_tiers(settings, tiers), roles=NO_BACKGROUND)
    with TestClient(app) as api:
        [shown] = api.get("/v1/tiers").json()["items"]
    assert shown["provider"]["versioned"] is True
    assert shown["provider"]["source"] == "bucket"
    assert shown["provider"]["billed_after_delete"] == "0s"  # a purge removes old versions


def test_start_up_refuses_a_tiers_file_that_contradicts_itself(tmp_path: Path) -> None:
    """`ckpt serve` stops before listening, with the reason, not a traceback."""
    path = tiers_file(tmp_path, autoclass=True, storage_class="NEARLINE")
    env = {"CKPT_TIERS_FILE": str(path), "CKPT_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ckpt"), "serve"],
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "configuration error" in done.stderr and "Autoclass" in done.stderr
    assert "Traceback" not in done.stderr
