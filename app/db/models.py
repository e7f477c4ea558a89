"""Catalog tables. Sized for millions of checkpoints: every query the engine and the
API make per run or per tier has an index; the file manifest is one JSON value per
checkpoint (it is read and written whole, never queried by file)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from app.db.types import UTCDateTime

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID = String(40)
NAME = String(63)
# Who made a change: `token:<id>:<name>`, `rule:<policy>/<rule>`, `system:scheduler`, ...
# (app.domain.access). NULL on rows written before actors were recorded.
ACTOR = String(200)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(NAME, unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("project_id", "name"),
        Index("ix_runs_status_ended_at", "status", "ended_at"),
        Index("ix_runs_resumed_from", "resumed_from"),
        Index("ix_runs_evaluate_requested_at", "evaluate_requested_at"),
        Index("ix_runs_next_due_at", "next_due_at"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(NAME)
    status: Mapped[str] = mapped_column(String(16), default="active")
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    policy: Mapped[str | None] = mapped_column(NAME, nullable=True)
    resumed_from: Mapped[str | None] = mapped_column(ID, nullable=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Running totals of the run's `active` checkpoints: the blast-radius base of a project
    # is a sum over its runs, not a scan of millions of checkpoints.
    active_checkpoints: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    active_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Set by a registration, commit or update: the run's policy must be evaluated again.
    # Durable, so any scheduler replica picks it up and a crash loses no request.
    evaluate_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When the periodic sweep evaluates the run next (app.policy.due): the next instant its
    # plan can change by the clock, or the time of an event that may have changed it (an
    # action that finished, a policy edit); NULL until first evaluated (due).
    next_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_by: Mapped[str | None] = mapped_column(ACTOR, nullable=True)
    updated_by: Mapped[str | None] = mapped_column(ACTOR, nullable=True)

    project: Mapped[Project] = relationship(lazy="raise")


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (
        UniqueConstraint("run_id", "step"),
        Index("ix_checkpoints_state_trashed_at", "state", "trashed_at"),
        Index("ix_checkpoints_locked_until", "locked_until"),  # a plan's lock scan
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    step: Mapped[int] = mapped_column(BigInteger)
    klass: Mapped[str] = mapped_column("class", NAME)
    state: Mapped[str] = mapped_column(String(16))
    uri: Mapped[str] = mapped_column(Text)
    # The primary location's tier, as `uri` is its uri: written with it in every change of
    # the primary (registration, import, move, re-save; NULL once deleted), so a plan reads
    # a million checkpoints without joining a million locations. `locations` stays the
    # truth a worker acts on. Triggers (migration 0014) carry a primary moved or removed by
    # any other writer (the previous release during a rollout); a row another writer
    # inserted without it is read through its primary (snapshot.load_scope).
    tier: Mapped[str | None] = mapped_column(NAME, nullable=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    files: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    metrics: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    pin_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime())
    committed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    trashed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_by: Mapped[str | None] = mapped_column(ACTOR, nullable=True)
    updated_by: Mapped[str | None] = mapped_column(ACTOR, nullable=True)
    # What the last reconciliation found: `ok`, or `drift` with the problem in health_detail
    # (a catalogued object missing, or its size or checksum changed).
    health: Mapped[str] = mapped_column(String(16), default="ok", server_default="ok")
    health_detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The uri names one object (Lightning's `*.ckpt`), not a prefix: its manifest is that
    # one file, and removing a location removes that object, never its directory.
    single_file: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Set by an undelete: no policy deletes or moves it before then (a person said "keep").
    protected_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # A `writing` checkpoint is a reservation: past this time without a commit or a
    # keepalive it is abandoned, and the scheduler aborts it. NULL in every other state.
    reserved_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The provider refused to delete its bytes (Object Lock retention or a legal hold): no
    # plan deletes or moves it before then; `lock_reason` says which, with the date.
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    lock_reason: Mapped[str | None] = mapped_column(Text, nullable=True)

    locations: Mapped[list[Location]] = relationship(
        lazy="raise", order_by="Location.id", cascade="all, delete-orphan"
    )


class Location(Base):
    """Where a checkpoint's bytes are; exactly one `primary` per checkpoint."""

    __tablename__ = "locations"
    __table_args__ = (
        UniqueConstraint("checkpoint_id", "tier"),
        Index("ix_locations_tier_role", "tier", "role"),
        # overlap checks: equal uri, and uri prefix (LIKE on PostgreSQL, a range on SQLite)
        Index("ix_locations_uri", "uri", postgresql_ops={"uri": "text_pattern_ops"}),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(ForeignKey("checkpoints.id", ondelete="CASCADE"))
    tier: Mapped[str] = mapped_column(NAME)
    uri: Mapped[str] = mapped_column(Text)
    storage_class: Mapped[str | None] = mapped_column(String(40), nullable=True)
    role: Mapped[str] = mapped_column(String(16))


class Action(Base):
    """One row of the action ledger: every change to storage goes through here."""

    __tablename__ = "actions"
    __table_args__ = (
        Index("ix_actions_state_due_at", "state", "due_at"),
        Index("ix_actions_checkpoint_id_state", "checkpoint_id", "state"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(ForeignKey("checkpoints.id"))
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    from_tier: Mapped[str | None] = mapped_column(NAME, nullable=True)
    to_tier: Mapped[str | None] = mapped_column(NAME, nullable=True)
    rule: Mapped[str] = mapped_column(String(140))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    step: Mapped[str | None] = mapped_column(String(32), nullable=True)  # last step done
    source_uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    dest_uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    sweep_id: Mapped[str | None] = mapped_column(ID, nullable=True, index=True)
    lease_owner: Mapped[str | None] = mapped_column(String(80), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    due_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Who asked for it: a token (manual requests) or the rule that planned it.
    actor: Mapped[str | None] = mapped_column(ACTOR, nullable=True)
    approved_by: Mapped[str | None] = mapped_column(ACTOR, nullable=True)  # released a hold
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # storage
    # Progress of a running transfer, written every few seconds by the lease keeper.
    bytes_done: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


@dataclass(frozen=True, slots=True)
class NewAction:
    """An action about to be written, as plain data: a sweep that plans thousands writes
    them in one statement (app.db.bulk) without building an ORM object for each."""

    id: str
    checkpoint_id: str
    run_id: str
    kind: str
    from_tier: str | None
    to_tier: str | None
    rule: str
    reason: str | None
    state: str
    bytes: int
    sweep_id: str | None
    due_at: datetime
    created_at: datetime
    actor: str | None

    def row(self) -> dict[str, Any]:
        """Every column of its `actions` row."""
        row = {name: getattr(self, name) for name in self.__slots__}
        row.update(
            step=None,
            source_uri=None,
            dest_uri=None,
            attempts=0,
            error=None,
            lease_owner=None,
            lease_until=None,
            updated_at=self.created_at,
            finished_at=None,
            approved_by=None,
            retries=0,
            bytes_done=0,
        )
        return row


class ShadowAction(Base):
    """One would-be action of a shadow policy (DESIGN section 17): what the policy would have
    done had it governed the run, recorded by the evaluation that found it and never carried
    out (no storage work, no hold, no audit). `created_at` is that evaluation's `now`; each
    (policy, checkpoint, kind, to_tier) is recorded once. Rows stay after the policy is
    switched to `enforce` or deleted: the history stays readable."""

    __tablename__ = "shadow_actions"
    __table_args__ = (
        Index("ix_shadow_actions_policy_created_at", "policy", "created_at"),
        Index("ix_shadow_actions_checkpoint_id", "checkpoint_id"),
        Index("ix_shadow_actions_run_id", "run_id"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    policy: Mapped[str] = mapped_column(NAME)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    checkpoint_id: Mapped[str] = mapped_column(ForeignKey("checkpoints.id"))
    step: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))  # delete | move | copy
    from_tier: Mapped[str | None] = mapped_column(NAME, nullable=True)
    to_tier: Mapped[str | None] = mapped_column(NAME, nullable=True)
    rule: Mapped[str] = mapped_column(String(140))  # <policy>/<rule>
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    trigger: Mapped[str] = mapped_column(String(32))  # as the evaluation's sweep's
    # The sweep row of the evaluation; NULL when it left none (a registration-triggered
    # evaluation that planned no real action keeps no sweep row).
    sweep_id: Mapped[str | None] = mapped_column(ID, nullable=True)


class PolicyRow(Base):
    """A validated policy document; the database holds the one set every replica runs."""

    __tablename__ = "policies"

    name: Mapped[str] = mapped_column(NAME, primary_key=True)
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(Text)  # the file it was loaded from, or "api"
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_by: Mapped[str | None] = mapped_column(ACTOR, nullable=True)


class Sweep(Base):
    """One evaluation that wrote actions to the ledger (scheduled, manual or triggered)."""

    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    trigger: Mapped[str] = mapped_column(String(32))  # schedule | manual | registration | run
    run_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    actions: Mapped[int] = mapped_column(Integer, default=0)
    held: Mapped[int] = mapped_column(Integer, default=0)
    actor: Mapped[str | None] = mapped_column(ACTOR, nullable=True)  # who started it


class Token(Base):
    """An API token. Only a hash of its secret is stored: the secret is shown once, at
    creation, and a stolen database yields no usable token."""

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(NAME)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256, hex
    scopes: Mapped[list[str]] = mapped_column(JSON)
    projects: Mapped[list[str]] = mapped_column(JSON)  # names, or ["*"]
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_by: Mapped[str] = mapped_column(ACTOR)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_by: Mapped[str | None] = mapped_column(ACTOR, nullable=True)


class AuditEvent(Base):
    """One state change of a checkpoint, run, policy, token or action: who, when, what it
    was before and after, and why (the rule, or the request). Written in the transaction of
    the change itself, so the trail has no gaps and no entries for changes rolled back."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_checkpoint_id_id", "checkpoint_id", "id"),
        Index("ix_audit_events_run_id_id", "run_id", "id"),
        Index("ix_audit_events_actor_id", "actor", "id"),
        Index("ix_audit_events_at", "at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    actor: Mapped[str] = mapped_column(ACTOR)
    entity: Mapped[str] = mapped_column(String(16))  # checkpoint | run | policy | token | action
    entity_id: Mapped[str] = mapped_column(String(140))
    event: Mapped[str] = mapped_column(String(32))  # created | updated | deleted | <a verb>
    checkpoint_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    run_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class ImportRow(Base):
    """One adoption of an existing tree (DESIGN section 14). Its counters and `cursor` (the
    last listed key every count accounts for) are written in the transaction of each
    batch it registers, so a crashed import resumes where its last batch ended and counts
    nothing twice. `owner` and `lease_until`: the process running it, and until when that
    claim holds without a renewal (another process takes over an expired one)."""

    __tablename__ = "imports"
    __table_args__ = (Index("ix_imports_state_lease_until", "state", "lease_until"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    uri: Mapped[str] = mapped_column(Text)
    tier: Mapped[str] = mapped_column(NAME)
    project: Mapped[str] = mapped_column(NAME)
    layout: Mapped[str] = mapped_column(String(16))
    run: Mapped[str | None] = mapped_column(NAME, nullable=True)
    klass: Mapped[str] = mapped_column("class", NAME)
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    active: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16))  # running | done | failed
    listed: Mapped[int] = mapped_column(BigInteger, default=0)
    discovered: Mapped[int] = mapped_column(BigInteger, default=0)
    registered: Mapped[int] = mapped_column(BigInteger, default=0)
    existing: Mapped[int] = mapped_column(BigInteger, default=0)
    runs: Mapped[int] = mapped_column(BigInteger, default=0)
    unrecognized: Mapped[int] = mapped_column(BigInteger, default=0)
    incomplete_count: Mapped[int] = mapped_column(BigInteger, default=0)
    skipped_count: Mapped[int] = mapped_column(BigInteger, default=0)
    incomplete: Mapped[list[dict[str, str]]] = mapped_column(JSON, default=list)
    skipped: Mapped[list[dict[str, str]]] = mapped_column(JSON, default=list)
    unrecognized_sample: Mapped[list[str]] = mapped_column(JSON, default=list)
    bytes_registered: Mapped[int] = mapped_column(BigInteger, default=0)
    cursor: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    sweep_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    owner: Mapped[str | None] = mapped_column(String(40), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_by: Mapped[str] = mapped_column(ACTOR)


class ImportItem(Base):
    """A checkpoint an import registered (or, dry, would register), in listing order."""

    __tablename__ = "import_items"
    __table_args__ = (
        Index("ix_import_items_import_id_id", "import_id", "id"),
        Index("ix_import_items_import_id_run_step", "import_id", "run", "step"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    import_id: Mapped[str] = mapped_column(ForeignKey("imports.id"))
    run: Mapped[str] = mapped_column(NAME)
    step: Mapped[int] = mapped_column(BigInteger)
    klass: Mapped[str] = mapped_column("class", NAME)
    uri: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    layout: Mapped[str] = mapped_column(String(16))
    checkpoint_id: Mapped[str | None] = mapped_column(ID, nullable=True)


class DeletedBytes(Base):
    """Bytes the service removed that the provider still bills: a soft-deleted GCS object,
    a noncurrent S3 version the bucket's lifecycle expires later. One row per location
    removed (a purge, or a move's source), until `billed_until` (NULL: for ever)."""

    __tablename__ = "deleted_bytes"
    __table_args__ = (Index("ix_deleted_bytes_billed_until", "billed_until"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    action_id: Mapped[str] = mapped_column(ID)  # the purge or move that removed them
    checkpoint_id: Mapped[str] = mapped_column(ID)
    project: Mapped[str] = mapped_column(NAME)
    run_id: Mapped[str] = mapped_column(ID)
    klass: Mapped[str] = mapped_column("class", NAME)
    tier: Mapped[str] = mapped_column(NAME)
    bytes: Mapped[int] = mapped_column(BigInteger)
    deleted_at: Mapped[datetime] = mapped_column(UTCDateTime())
    billed_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
