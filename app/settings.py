"""Service configuration: every `CKPT_*` variable of the contract, validated at start."""

from __future__ import annotations

import ipaddress
import math
import os
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.domain.duration import parse_duration

ENV_PREFIX = "CKPT_"
MIN_BOOTSTRAP_TOKEN_LENGTH = 16
MAX_PLAN_PROCESSES = 64


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU limit of the container this process runs in (cgroup v2 `cpu.max`, or v1's
    CFS quota), in cores; None when there is none. A pod limited to one core on a node of
    64 must not split its plans 64 ways."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def usable_cpus() -> int:
    """The cores this process may use: those it may run on, within its container's limit."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    limit = cgroup_cpu_limit()
    if limit is not None:
        return max(1, min(count or 1, math.ceil(limit)))
    return max(1, count or 1)


def _duration(value: object) -> object:
    return parse_duration(value) if isinstance(value, str) else value


Duration = Annotated[timedelta, BeforeValidator(_duration)]


def _empty_as_unset(value: object) -> object:
    return None if isinstance(value, str) and not value.strip() else value


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    database_url: str = "sqlite:///./var/ckpt.db"
    data_dir: Path = Path("./var/data")
    tiers_file: Annotated[Path | None, BeforeValidator(_empty_as_unset)] = None
    policies_dir: Path = Path("./policies")
    sweep_interval: Duration = timedelta(minutes=5)
    trash_retention: Duration = timedelta(days=7)
    reconcile_interval: Duration = timedelta(hours=24)  # 0s: only on demand
    # how long a `writing` reservation lives without a keepalive (DESIGN section 12)
    reservation_ttl: Duration = timedelta(minutes=30)
    # how long a running import's claim holds without a renewal: a process that died
    # mid-import is replaced this long after its last batch (DESIGN section 14)
    import_lease: Duration = timedelta(seconds=30)
    # how many processes (the service's own included) evaluate a plan of 200,000 active
    # checkpoints or more, each a range of runs, on PostgreSQL; 1: one process plans alone
    plan_processes: int = Field(default_factory=lambda: min(usable_cpus(), 4))
    host: str = "127.0.0.1"
    port: int = 8000
    auth: Literal["on", "off"] = "on"
    bootstrap_token: Annotated[SecretStr | None, BeforeValidator(_empty_as_unset)] = None
    # `ckpt worker` and `ckpt scheduler` serve their own counters on this port (unset: not
    # at all); the API serves them, and the catalog's, on its own /metrics.
    metrics_port: Annotated[int | None, BeforeValidator(_empty_as_unset)] = None

    @model_validator(mode="after")
    def _auth_off_only_on_loopback(self) -> Settings:
        if self.auth == "off" and not is_loopback(self.host):
            raise ValueError(
                f"CKPT_AUTH=off is refused unless CKPT_HOST is a loopback address "
                f"(got {self.host!r})"
            )
        if self.bootstrap_token is not None:
            # The message never repeats the value: it is an admin credential.
            secret = self.bootstrap_token.get_secret_value()
            if len(secret) < MIN_BOOTSTRAP_TOKEN_LENGTH or any(c.isspace() for c in secret):
                raise ValueError(
                    f"CKPT_BOOTSTRAP_TOKEN must be at least {MIN_BOOTSTRAP_TOKEN_LENGTH} "
                    "characters without spaces (it is an admin token)"
                )
        if self.sweep_interval <= timedelta(0):
            raise ValueError("CKPT_SWEEP_INTERVAL must be longer than 0s")
        if self.reservation_ttl <= timedelta(0):
            raise ValueError("CKPT_RESERVATION_TTL must be longer than 0s")
        if self.reconcile_interval < timedelta(0):
            raise ValueError("CKPT_RECONCILE_INTERVAL must be 0s (off) or longer")
        if not 1 <= self.plan_processes <= MAX_PLAN_PROCESSES:
            raise ValueError(
                f"CKPT_PLAN_PROCESSES must be between 1 and {MAX_PLAN_PROCESSES} "
                f"(got {self.plan_processes})"
            )
        if not 0 < self.port < 65536:
            raise ValueError(f"CKPT_PORT must be between 1 and 65535 (got {self.port})")
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise ValueError(
                f"CKPT_METRICS_PORT must be between 1 and 65535 (got {self.metrics_port})"
            )
        return self


class SettingsError(Exception):
    """A configuration value is wrong; the message names the variable."""


def describe_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        name = ENV_PREFIX + str(item["loc"][0]).upper() if item["loc"] else "settings"
        message = str(item["msg"]).removeprefix("Value error, ")
        lines.append(f"{name}: {message}" if item["loc"] else message)
    return "; ".join(lines)


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as error:
        raise SettingsError(describe_validation_error(error)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
