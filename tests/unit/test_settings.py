from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.settings import Settings, SettingsError, cgroup_cpu_limit, load_settings, usable_cpus

CONTRACT_VARIABLES = (
    "CKPT_DATABASE_URL",
    "CKPT_DATA_DIR",
    "CKPT_TIERS_FILE",
    "CKPT_POLICIES_DIR",
    "CKPT_SWEEP_INTERVAL",
    "CKPT_TRASH_RETENTION",
    "CKPT_HOST",
    "CKPT_PORT",
    "CKPT_AUTH",
    "CKPT_BOOTSTRAP_TOKEN",
    "CKPT_RESERVATION_TTL",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CKPT_* variable of the surrounding shell leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("CKPT_"):
            monkeypatch.delenv(name)


def test_documented_defaults() -> None:
    settings = load_settings()
    assert settings.database_url == "sqlite:///./var/ckpt.db"
    assert settings.data_dir == Path("./var/data")
    assert settings.tiers_file is None
    assert settings.policies_dir == Path("./policies")
    assert settings.sweep_interval == timedelta(minutes=5)
    assert settings.trash_retention == timedelta(days=7)
    assert settings.reconcile_interval == timedelta(hours=24)
    assert settings.host == "127.0.0.1"
    assert settings.port == 8000
    assert settings.auth == "on"
    assert settings.bootstrap_token is None
    assert settings.reservation_ttl == timedelta(minutes=30)


def test_every_variable_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    values = {
        "CKPT_DATABASE_URL": "postgresql+psycopg://ckpt@db.internal:5432/ckpt",
        "CKPT_DATA_DIR": str(tmp_path / "data"),
        "CKPT_TIERS_FILE": str(tmp_path / "tiers.yaml"),
        "CKPT_POLICIES_DIR": str(tmp_path / "policies"),
        "CKPT_SWEEP_INTERVAL": "90s",
        "CKPT_TRASH_RETENTION": "30d",
        "CKPT_HOST": "0.0.0.0",
        "CKPT_PORT": "9100",
        "CKPT_AUTH": "on",
        "CKPT_BOOTSTRAP_TOKEN": "s3cr3t-admin-token",
        "CKPT_RESERVATION_TTL": "2h",
    }
    assert set(values) == set(CONTRACT_VARIABLES)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.database_url == values["CKPT_DATABASE_URL"]
    assert settings.data_dir == tmp_path / "data"
    assert settings.tiers_file == tmp_path / "tiers.yaml"
    assert settings.policies_dir == tmp_path / "policies"
    assert settings.sweep_interval == timedelta(seconds=90)
    assert settings.trash_retention == timedelta(days=30)
    assert settings.host == "0.0.0.0"
    assert settings.port == 9100
    assert settings.auth == "on"
    assert isinstance(settings.bootstrap_token, SecretStr)
    assert settings.bootstrap_token.get_secret_value() == "s3cr3t-admin-token"
    assert settings.reservation_ttl == timedelta(hours=2)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("CKPT_SWEEP_INTERVAL", "15m", timedelta(minutes=15)),
        ("CKPT_SWEEP_INTERVAL", "12h", timedelta(hours=12)),
        ("CKPT_TRASH_RETENTION", "0s", timedelta(0)),
        ("CKPT_TRASH_RETENTION", "2w", timedelta(weeks=2)),
        ("CKPT_RECONCILE_INTERVAL", "6h", timedelta(hours=6)),
        ("CKPT_RECONCILE_INTERVAL", "0s", timedelta(0)),  # on demand only
        ("CKPT_RESERVATION_TTL", "90s", timedelta(seconds=90)),
        ("CKPT_RESERVATION_TTL", "12h", timedelta(hours=12)),
    ],
)
def test_durations_are_parsed(
    monkeypatch: pytest.MonkeyPatch, name: str, text: str, expected: timedelta
) -> None:
    monkeypatch.setenv(name, text)
    settings = load_settings()
    assert getattr(settings, name.removeprefix("CKPT_").lower()) == expected


def test_constructor_arguments_take_durations_as_text() -> None:
    settings = Settings(sweep_interval="30s", trash_retention="1d")
    assert settings.sweep_interval == timedelta(seconds=30)
    assert settings.trash_retention == timedelta(days=1)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_auth_off_on_loopback_is_accepted(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    monkeypatch.setenv("CKPT_AUTH", "off")
    monkeypatch.setenv("CKPT_HOST", host)
    settings = load_settings()
    assert settings.auth == "off"
    assert settings.host == host


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.1.10", "ckpt.example.com"])
def test_auth_off_on_non_loopback_host_is_refused(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("CKPT_AUTH", "off")
    monkeypatch.setenv("CKPT_HOST", host)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert "CKPT_AUTH" in message
    assert "CKPT_HOST" in message
    assert host in message


def test_auth_on_with_non_loopback_host_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_HOST", "0.0.0.0")
    assert load_settings().host == "0.0.0.0"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CKPT_SWEEP_INTERVAL", "soon"),
        ("CKPT_SWEEP_INTERVAL", "0s"),
        ("CKPT_SWEEP_INTERVAL", "5"),
        ("CKPT_TRASH_RETENTION", "-1d"),
        ("CKPT_RECONCILE_INTERVAL", "-1h"),
        ("CKPT_RECONCILE_INTERVAL", "daily"),
        ("CKPT_RESERVATION_TTL", "0s"),  # every reservation would be abandoned at once
        ("CKPT_RESERVATION_TTL", "-5m"),
        ("CKPT_RESERVATION_TTL", "half an hour"),
        ("CKPT_TRASH_RETENTION", "999999999w"),
        ("CKPT_PORT", "abc"),
        ("CKPT_PORT", "0"),
        ("CKPT_PORT", "65536"),
        ("CKPT_AUTH", "maybe"),
        ("CKPT_AUTH", "false"),
        ("CKPT_PLAN_PROCESSES", "0"),
        ("CKPT_PLAN_PROCESSES", "65"),
        ("CKPT_PLAN_PROCESSES", "two"),
    ],
)
def test_bad_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert name in str(caught.value)


def test_malformed_duration_message_shows_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_SWEEP_INTERVAL", "soon")
    with pytest.raises(SettingsError, match=r"CKPT_SWEEP_INTERVAL: malformed duration 'soon'"):
        load_settings()


def test_every_bad_variable_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_SWEEP_INTERVAL", "soon")
    monkeypatch.setenv("CKPT_PORT", "abc")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "CKPT_SWEEP_INTERVAL" in str(caught.value)
    assert "CKPT_PORT" in str(caught.value)


def test_bootstrap_token_is_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    token = "tok-0123456789abcdef"
    monkeypatch.setenv("CKPT_BOOTSTRAP_TOKEN", token)
    settings = load_settings()
    assert isinstance(settings.bootstrap_token, SecretStr)
    assert settings.bootstrap_token.get_secret_value() == token
    assert token not in repr(settings)
    assert token not in str(settings)
    assert token not in settings.model_dump_json()


def test_bootstrap_token_not_leaked_by_an_error_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    token = "tok-0123456789abcdef"
    monkeypatch.setenv("CKPT_BOOTSTRAP_TOKEN", token)
    monkeypatch.setenv("CKPT_PORT", "abc")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert token not in str(caught.value)


@pytest.mark.parametrize("name", ["CKPT_TIERS_FILE", "CKPT_BOOTSTRAP_TOKEN"])
def test_empty_optional_variable_means_unset(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # `CKPT_TIERS_FILE=` must not become Path("."), nor an empty admin token be seeded
    monkeypatch.setenv(name, "")
    settings = load_settings()
    assert getattr(settings, name.removeprefix("CKPT_").lower()) is None


def test_settings_error_is_not_a_pydantic_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_PORT", "abc")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert caught.value.__cause__ is None
    assert "pydantic" not in str(caught.value)


@pytest.mark.parametrize("token", ["short-secret", "a secret with spaces in it"])
def test_weak_bootstrap_token_is_refused_without_repeating_it(
    monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    monkeypatch.setenv("CKPT_BOOTSTRAP_TOKEN", token)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "CKPT_BOOTSTRAP_TOKEN" in str(caught.value)
    assert token not in str(caught.value)


def test_plans_use_the_cores_by_default_and_as_told(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().plan_processes == min(usable_cpus(), 4)
    assert 1 <= usable_cpus() <= (os.cpu_count() or 1)
    monkeypatch.setenv("CKPT_PLAN_PROCESSES", "1")  # one process plans alone
    assert load_settings().plan_processes == 1


@pytest.mark.parametrize(
    ("files", "cores"),
    [
        ({"cpu.max": "200000 100000\n"}, 2.0),  # cgroup v2, a limit of two cores
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),  # no limit
        ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),  # no cgroup files at all
    ],
)
def test_a_containers_cpu_limit_is_read(
    tmp_path: Path, files: dict[str, str], cores: float | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_limit(tmp_path) == cores
