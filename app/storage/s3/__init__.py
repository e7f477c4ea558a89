"""S3 and S3-compatible tiers (AWS, MinIO, Ceph, rclone, moto...).

Every transfer is built here from low-level calls (PutObject, UploadPart, UploadPartCopy,
CopyObject): boto3's managed transfer (s3transfer behind upload_fileobj / copy /
download_fileobj) is never used. That keeps memory bounded by our own part pipeline,
gives one retry policy (retry.retrying, with botocore's own retries off), and means the
CRT transfer client, which boto3 may pick for managed transfers and which ignores
`endpoint_url`, can never be chosen for an S3-compatible tier.

Credentials come from boto3's default chain only and appear in no log or message.
"""

from app.storage.s3.adapter import S3Storage
from app.storage.s3.errors import translate

__all__ = ["S3Storage", "translate"]
