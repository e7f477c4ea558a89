"""docker-compose.yml: valid under the Compose specification (check-jsonschema's bundled
schema, offline), and wired as the service needs it: migrations once before any other
process, two workers, access control on, every process on the same tiers file (which
loads and points at the compose stores) and policies folder."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
import typer.main
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from app.cli import cli
from app.policy.loading import load_policy_files
from app.settings import Settings, load_settings
from app.tiers_config import load_tiers
from tests.deploy.support import REPO, dev_tool, image_env, unknown_settings
from tests.storage.gcs_server import GcsEndpoint
from tests.storage.ports import free_port
from tests.storage.s3_servers import S3Endpoint

COMPOSE = REPO / "docker-compose.yml"
CKPT_SERVICES = ("create-buckets", "migrate", "api", "scheduler", "worker")
LONG_RUNNING = ("api", "scheduler", "worker")
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}
INTERPOLATION = re.compile(r"\$\{(\w+)(?:(:?)([-?])([^}]*))?\}")


class MissingVariable(Exception):
    pass


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution, as `docker compose` does it from the shell."""

    def substitute(match: re.Match[str]) -> str:
        name, colon, kind, word = match.groups()
        value = env.get(name)
        missing = value is None or (colon == ":" and value == "")
        if kind == "?" and missing:
            raise MissingVariable(f"{name}: {word}")
        if kind == "-" and missing:
            return str(word)
        return value or ""

    return INTERPOLATION.sub(substitute, text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())  # YAML merge keys resolved
    return loaded


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def binds(service: dict[str, Any]) -> dict[str, tuple[Path, bool]]:
    """Container path -> (host path in the repository, read-only) of each bind mount."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        if source.startswith("."):
            mounts[target] = ((REPO / source).resolve(), mode == ["ro"])
    return mounts


def resolved_env(service: dict[str, Any], shell: dict[str, str]) -> dict[str, str]:
    """The CKPT_* variables the process sees: the image's ENV, then the service's,
    interpolated from `shell`."""
    image = {k: v for k, v in image_env().items() if k.startswith("CKPT_")}
    return {**image, **{k: interpolate(v, shell) for k, v in environment(service).items()}}


def test_compose_file_is_valid_under_the_compose_specification() -> None:
    result = dev_tool("check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(COMPOSE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_stack_has_the_stores_and_the_split_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"postgres", "minio", "fake-gcs", *CKPT_SERVICES} <= set(services)
    commands = set(typer.main.get_command(cli).commands)  # type: ignore[attr-defined]
    for name in ("migrate", *LONG_RUNNING):
        (command,) = services[name]["command"]
        assert command == name and command in commands, services[name]["command"]
    # third-party images pinned to a release: a rebuild a year later runs the same stores
    for name in ("postgres", "minio", "fake-gcs"):
        image = services[name]["image"]
        assert ":" in image and not image.endswith(":latest"), image


def test_two_workers(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert worker["deploy"]["replicas"] == 2
    # replicas cannot share a fixed container name or a host port
    assert "container_name" not in worker and "ports" not in worker


def test_processes_start_only_after_the_migration_succeeded(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in LONG_RUNNING:
        assert services[name]["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"},
            "create-buckets": {"condition": "service_completed_successfully"},
        }, name
    migrate = services["migrate"]
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert "healthcheck" in services["postgres"]
    assert migrate["restart"] == "no" and "deploy" not in migrate  # once, one replica
    assert services["create-buckets"]["depends_on"]["minio"] == {"condition": "service_healthy"}


def test_only_the_api_keeps_the_image_healthcheck(compose: dict[str, Any]) -> None:
    """The image's HEALTHCHECK asks /healthz, which only `ckpt api` serves."""
    services = compose["services"]
    assert "healthcheck" not in services["api"]
    for name in ("create-buckets", "migrate", "scheduler", "worker"):
        assert services[name]["healthcheck"] == {"disable": True}, name


def test_every_ckpt_variable_set_is_a_setting(compose: dict[str, Any]) -> None:
    names = {name for s in compose["services"].values() for name in environment(s)}
    assert unknown_settings(names) == []


def test_access_control_stays_on_with_a_required_bootstrap_token(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    for name in CKPT_SERVICES:
        assert environment(services[name])["CKPT_AUTH"] == "on", name
    # Without a token the stack refuses to start instead of starting locked out.
    with pytest.raises(MissingVariable, match="CKPT_BOOTSTRAP_TOKEN"):
        resolved_env(services["api"], {})

    token = "compose-admin-token-0123456789"
    for variable, value in resolved_env(services["api"], {"CKPT_BOOTSTRAP_TOKEN": token}).items():
        monkeypatch.setenv(variable, value)
    settings = load_settings()  # the start-up validation, with the image's CKPT_HOST
    assert settings.auth == "on" and settings.host == "0.0.0.0"
    assert settings.bootstrap_token is not None
    assert settings.bootstrap_token.get_secret_value() == token
    assert settings.database_url.startswith("postgresql+psycopg://ckpt:")
    assert urlsplit(settings.database_url).hostname == "postgres"


def test_published_ports_stay_on_this_machine(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_every_process_loads_the_same_tiers_and_policies(compose: dict[str, Any]) -> None:
    services = compose["services"]
    seen = set()
    for name in CKPT_SERVICES:
        env, mounts = environment(services[name]), binds(services[name])
        tiers_file, read_only = mounts[env["CKPT_TIERS_FILE"]]
        policies_dir, policies_read_only = mounts[env["CKPT_POLICIES_DIR"]]
        assert read_only and policies_read_only, name
        assert policies_dir == REPO / "policies", name
        seen.add((tiers_file, policies_dir))
    ((tiers_file, policies_dir),) = seen  # one set of files for every process

    tiers = load_tiers(Settings(tiers_file=tiers_file, policies_dir=policies_dir))
    assert load_policy_files(policies_dir, [t.name for t in tiers])
    emulator = urlsplit(environment(services["api"])["STORAGE_EMULATOR_HOST"])
    gcs_command = services["fake-gcs"]["command"]
    for tier in tiers:
        scheme = tier.url.split(":", 1)[0]
        assert scheme in ("s3", "gs"), f"{tier.name}: every container must see its bytes"
        if scheme == "s3":
            endpoint = urlsplit(tier.endpoint_url or "")
            assert (endpoint.hostname, endpoint.port) == ("minio", 9000), tier.name
        else:
            assert (emulator.hostname, f"-port={emulator.port}") == ("fake-gcs", "-port=4443")
            assert f"-port={emulator.port}" in gcs_command
    assert {t.url.split(":", 1)[0] for t in tiers} == {"s3", "gs"}  # both stores in use


# --- the bucket creation that runs on first start -----------------------------------------------


def load_create_buckets() -> ModuleType:
    path = REPO / "deploy/compose/create_buckets.py"
    spec = importlib.util.spec_from_file_location("create_buckets", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_create_buckets_makes_each_tier_bucket_and_can_run_again(
    moto_s3: S3Endpoint,
    fake_gcs: GcsEndpoint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The compose tiers file, with MinIO's address swapped for a test S3 server, plus a tier
    on a real provider, which must be left alone."""
    compose_tiers = (REPO / "deploy/compose/tiers.yaml").read_text()
    tiers = yaml.safe_load(compose_tiers.replace("http://minio:9000", moto_s3.url))
    tiers["tiers"].append({"name": "aws", "url": "s3://ckpt-real-account/x"})
    (tmp_path / "tiers.yaml").write_text(yaml.safe_dump(tiers))
    monkeypatch.setenv("CKPT_TIERS_FILE", str(tmp_path / "tiers.yaml"))
    monkeypatch.setenv("CKPT_POLICIES_DIR", str(tmp_path / "none"))
    create_buckets = load_create_buckets()

    assert create_buckets.main() == 0
    first = capsys.readouterr().out
    assert create_buckets.main() == 0
    second = capsys.readouterr().out

    s3 = {b["Name"] for b in boto3.client("s3", endpoint_url=moto_s3.url).list_buckets()["Buckets"]}
    gcs = storage.Client(project="test", credentials=AnonymousCredentials())  # the emulator
    assert {"ckpt-hot", "ckpt-warm"} <= s3 and "ckpt-real-account" not in s3
    assert {"ckpt-cold", "ckpt-archive"} <= {b.name for b in gcs.list_buckets()}
    for bucket in ("s3://ckpt-hot", "s3://ckpt-warm", "gs://ckpt-cold", "gs://ckpt-archive"):
        assert re.search(rf"^{bucket}\b.*: created$", first, re.M), first
        assert re.search(rf"^{bucket}\b.*: exists$", second, re.M), second
    assert "s3://ckpt-real-account: skipped" in first


def test_create_buckets_gives_up_on_a_store_that_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stores may still be starting: retried for a while, then a clear exit, not a hang."""
    create_buckets = load_create_buckets()
    monkeypatch.setattr(create_buckets, "WAIT_SECONDS", 0.5)
    for variable, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
        monkeypatch.setenv(variable, value)  # signed requests need some keys to reach the wire
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    nowhere = f"http://127.0.0.1:{free_port()}"
    for create in (
        lambda: create_buckets.create_s3_bucket(nowhere, "ckpt-hot"),
        lambda: create_buckets.create_gcs_bucket("ckpt-cold"),
    ):
        with pytest.raises(SystemExit, match="unreachable"):
            create_buckets._retry_until_up(create, "test")
