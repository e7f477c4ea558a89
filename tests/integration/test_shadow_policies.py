"""Shadow policies (DESIGN section 17): `mode: shadow` is validated and round-trips, a shadow
policy governs no run, every kind of evaluation records its would-be actions in the shadow
ledger and nothing else, and `GET /v1/policies/{name}/shadow` and `/metrics` say how that
differs from what the policy in force did, and what people came back for."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, event, func, select, update

from app.db.models import Action, Checkpoint, Sweep
from app.db.session import session_scope
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import (
    ago,
    assert_problem,
    checkpoint_post,
    end_run,
    fetch_checkpoint,
    instant,
    iso,
    issue_token,
    ledger,
    make_executor,
    make_run,
    place_checkpoint,
    put_policy,
    step_files,
    sweep_now,
    token_client,
)
from tests.integration.shadow_world import (
    ENFORCED,
    SHADOW,
    evaluate_requested,
    periodic_sweep,
    priced,
    shadow,
    shadow_rows,
    usd_month,
)


@pytest.fixture
def app(settings: Settings, clean_engine: Engine) -> FastAPI:
    return create_app(priced(settings), engine=clean_engine, roles=NO_BACKGROUND)


@pytest.fixture
def policies(client: TestClient) -> None:
    put_policy(client, ENFORCED)
    put_policy(client, SHADOW)


def keys(actions: list[dict[str, Any]]) -> set[tuple[str, str, str | None]]:
    return {(a["checkpoint_id"], a["kind"], a["to_tier"]) for a in actions}


# --- the schema ---------------------------------------------------------------------------


def test_mode_round_trips_through_put_and_get(client: TestClient) -> None:
    stored = put_policy(client, SHADOW)
    assert stored["mode"] == "shadow" and stored["policy"]["mode"] == "shadow"
    got = client.get("/v1/policies/candidate").json()
    assert got["mode"] == "shadow" and got["policy"] == stored["policy"]
    listed = {p["name"]: p["mode"] for p in client.get("/v1/policies").json()["items"]}
    assert listed == {"candidate": "shadow"}
    enforced = put_policy(client, SHADOW.replace("mode: shadow", "mode: enforce"))
    assert enforced["mode"] == "enforce"
    assert put_policy(client, ENFORCED)["mode"] == "enforce"  # the default


def test_an_unknown_mode_is_refused_naming_the_field(client: TestClient) -> None:
    put_policy(client, SHADOW)
    for body in (SHADOW.replace("mode: shadow", "mode: dry-run"), {"mode": 1, "rules": []}):
        if isinstance(body, str):
            response = client.put(
                "/v1/policies/candidate", content=body, headers={"content-type": "application/yaml"}
            )
        else:
            response = client.put("/v1/policies/candidate", json=body)
        assert_problem(response, 422, "mode")
    assert client.get("/v1/policies/candidate").json()["mode"] == "shadow"  # left alone


def test_switching_mode_is_a_policy_change_audited_like_any(client: TestClient) -> None:
    put_policy(client, SHADOW)
    put_policy(client, SHADOW.replace("mode: shadow", "mode: enforce"))
    events = [
        e
        for e in client.get("/v1/audit", params={"limit": 1000}).json()["items"]
        if e["entity"] == "policy" and e["entity_id"] == "candidate"
    ]
    assert [e["event"] for e in events] == ["created", "updated"]
    assert events[1]["before"]["document"]["mode"] == "shadow"
    assert "mode" not in events[1]["after"]["document"]  # enforce is the default


# --- a shadow policy governs no run -------------------------------------------------------


@pytest.mark.usefixtures("policies")
def test_a_run_naming_a_shadow_policy_is_governed_by_none(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    """Not by the shadow policy, and not widened to the default either."""
    run = make_run(client, policy="candidate")
    rolling = [place_checkpoint(client, data_dir, run, s) for s in (1, 2, 3, 4)]
    debug = [place_checkpoint(client, data_dir, run, s, "debug") for s in (5, 6)]

    plan = client.post("/v1/plan", json={"run_id": run["id"]}).json()
    sweep = sweep_now(client)

    assert plan["actions"] == [] and sweep["actions"] == [] and ledger(client) == []
    assert {tuple(k["reasons"]) for k in plan["kept"]} == {("no policy governs this run",)}
    recorded = {(a["checkpoint_id"], a["kind"]) for a in shadow(client)["actions"]}
    assert recorded == {(rolling[0]["id"], "delete"), (rolling[1]["id"], "delete")}
    # named in a what-if, a shadow policy plans like any other
    what_if = client.post("/v1/plan", json={"run_id": run["id"], "policy": "candidate"}).json()
    assert {(a["checkpoint_id"], a["kind"]) for a in what_if["actions"]} == recorded
    assert all(fetch_checkpoint(client, c["id"])["state"] == "active" for c in rolling + debug)


@pytest.mark.usefixtures("policies")
def test_the_policy_in_force_governs_and_the_shadow_policy_only_records(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    rolling = [place_checkpoint(client, data_dir, run, s) for s in (1, 2, 3, 4, 5)]
    debug = [place_checkpoint(client, data_dir, run, s, "debug") for s in (6, 7)]
    other = make_run(client, "elsewhere", "run-1")  # the candidate would not govern it
    for s in (1, 2, 3, 4):
        place_checkpoint(client, data_dir, other, s)

    sweep = sweep_now(client)

    real = ledger(client)
    assert [(a["checkpoint_id"], a["rule"]) for a in real] == [
        (debug[0]["id"], "default/debug-keep-1")
    ]
    assert sweep["actions"] == [real[0]["id"]]
    answer = shadow(client)
    assert answer["policy"] == "candidate" and answer["mode"] == "shadow"
    assert [(a["checkpoint_id"], a["kind"], a["rule"]) for a in answer["actions"]] == [
        (c["id"], "delete", "candidate/rolling-keep-2") for c in rolling[:3]
    ]
    row = answer["actions"][0]
    assert row["run_id"] == run["id"] and row["step"] == 1 and row["from_tier"] == "hot"
    assert row["bytes"] == rolling[0]["size_bytes"] and "keep_last 2" in row["reason"]
    assert instant(row["created_at"]) == instant(next(iter(shadow_rows_at(app))))
    assert all(fetch_checkpoint(client, c["id"])["state"] == "active" for c in rolling)
    with session_scope(app.state.session_factory) as session:  # no hold, no action row
        assert session.execute(select(func.count()).select_from(Action)).scalar_one() == 1
    assert {r.sweep_id for r in shadow_rows(app)} == {sweep["id"]}
    assert {r.trigger for r in shadow_rows(app)} == {"manual"}


def shadow_rows_at(app: FastAPI) -> Iterator[str]:
    for row in shadow_rows(app):
        yield iso(row.created_at)


@pytest.mark.usefixtures("policies")
def test_repeated_evaluations_record_each_would_be_action_once(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    """The shadow policy sees its own deletes done: a new save deletes one more, not four."""
    run = make_run(client)
    made = [place_checkpoint(client, data_dir, run, s) for s in (1, 2, 3, 4, 5)]
    sweep_now(client)
    sweep_now(client)
    periodic_sweep(app, datetime.now(UTC))
    assert len(shadow_rows(app)) == 3

    made.append(place_checkpoint(client, data_dir, run, 6))
    evaluate_requested(app, datetime.now(UTC))  # the registration's evaluation

    rows = shadow_rows(app)
    assert [(r.checkpoint_id, r.kind) for r in rows] == [(c["id"], "delete") for c in made[:4]]
    assert rows[-1].trigger == "registration"
    assert rows[-1].sweep_id is None  # it planned no real action: it left no sweep row
    with session_scope(app.state.session_factory) as session:
        triggers = session.execute(select(Sweep.trigger)).scalars().all()
    assert "registration" not in triggers


@pytest.mark.usefixtures("policies")
def test_a_periodic_sweep_comes_back_when_the_shadow_plan_can_change(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    """The policy in force has nothing to wait for; the shadow policy's `age: 2d` makes the
    run due again when it is crossed, and the move is recorded at that sweep's time."""
    now = datetime.now(UTC)
    run = make_run(client)
    milestone = place_checkpoint(
        client, data_dir, run, 10, "milestone", created_at=now - timedelta(days=1)
    )
    place_checkpoint(client, data_dir, run, 20)  # the resume point
    periodic_sweep(app, now)
    assert shadow_rows(app) == []
    periodic_sweep(app, now + timedelta(hours=23))
    assert shadow_rows(app) == []

    later = now + timedelta(days=1, seconds=1)
    periodic_sweep(app, later)

    (row,) = shadow_rows(app)
    assert (row.checkpoint_id, row.kind, row.from_tier, row.to_tier) == (
        milestone["id"],
        "move",
        "hot",
        "cold",
    )
    assert row.created_at == later and row.trigger == "schedule"
    assert fetch_checkpoint(client, milestone["id"])["tier"] == "hot"


@pytest.mark.usefixtures("policies")
def test_the_shadow_view_follows_its_own_moves_and_copies(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    """A would-be move leaves the checkpoint on its target in the shadow's view, a would-be
    copy adds the tier: neither is recorded again, and after a policy edit (replanned by
    the next periodic sweep) a rule acting on where the shadow put it sees it there."""
    run = make_run(client)
    milestone = place_checkpoint(client, data_dir, run, 10, "milestone", created_at=ago(days=3))
    final = place_checkpoint(client, data_dir, run, 20, "final")
    end_run(client, run["id"], ago(hours=1))
    sweep_now(client)
    assert {(r.checkpoint_id, r.kind, r.to_tier) for r in shadow_rows(app)} == {
        (milestone["id"], "move", "cold"),
        (final["id"], "copy", "archive"),
    }
    edited = SHADOW.replace(
        "  - {name: final-archive",
        "  - {name: cold-to-archive, class: milestone, when: {on_tier: [cold]},"
        " action: {move_to: archive}}\n"
        "  - {name: archived-finals, class: final, when: {on_tier: [hot]}, keep_last: 0,"
        " action: delete}\n"
        "  - {name: final-archive",
    )
    put_policy(client, edited)

    periodic_sweep(app, datetime.now(UTC))  # the edit made every run due
    sweep_now(client)

    rows = shadow_rows(app)
    assert len(rows) == 4
    assert [(r.checkpoint_id, r.kind, r.from_tier, r.to_tier) for r in rows[2:]] == [
        (milestone["id"], "move", "cold", "archive"),  # it is on cold in the shadow's view
        (final["id"], "delete", "hot", None),  # its archive copy is no primary
    ]
    assert fetch_checkpoint(client, milestone["id"])["tier"] == "hot"


# --- the report -----------------------------------------------------------------------------


@pytest.fixture
def history(client: TestClient, app: FastAPI, data_dir: Path) -> dict[str, Any]:
    """A run of `proj` under the default, shadowed by the candidate: the candidate would
    delete rolling steps 1 to 3, move the milestone to cold and copy the final to archive.
    Then step 1 is restored to warm, step 2 pinned and step 3 deleted by a person; the
    default deletes the older debug checkpoint."""
    put_policy(client, ENFORCED)
    put_policy(client, SHADOW)
    run = make_run(client)
    rolling = [
        place_checkpoint(client, data_dir, run, s, files=step_files(s, size=100 * s))
        for s in (1, 2, 3, 4, 5)
    ]
    milestone = place_checkpoint(
        client, data_dir, run, 10, "milestone", created_at=ago(days=3), files=step_files(10, 3)
    )
    debug = [place_checkpoint(client, data_dir, run, s, "debug") for s in (11, 12)]
    final = place_checkpoint(client, data_dir, run, 20, "final")
    end_run(client, run["id"], ago(hours=1))
    first = sweep_now(client)
    recorded = shadow_rows(app)
    assert len(recorded) == 5
    after_sweep = datetime.now(UTC)
    restore = client.post(f"/v1/checkpoints/{rolling[0]['id']}/restore", json={"tier": "warm"})
    assert restore.status_code == 202, restore.text
    assert checkpoint_post(client, rolling[1]["id"], "pin", {"reason": "paper"}).status_code == 200
    assert client.delete(f"/v1/checkpoints/{rolling[2]['id']}").status_code == 202
    make_executor(app).drain()
    return {
        "run": run,
        "rolling": rolling,
        "milestone": milestone,
        "debug": debug,
        "final": final,
        "sweep": first,
        "restore": restore.json(),
        "recorded_at": recorded[0].created_at,
        "after_sweep": after_sweep,
    }


def test_divergence_and_regrets(client: TestClient, history: dict[str, Any]) -> None:
    rolling, milestone = history["rolling"], history["milestone"]
    answer = shadow(client)
    divergence = answer["divergence"]

    # steps 1-3 are still stored (3 is trashed, still billed): their bytes, at their tiers
    assert divergence["bytes_freed"] == sum(c["size_bytes"] for c in rolling[:3])
    expected = (
        usd_month("hot", rolling[0]["size_bytes"])
        + usd_month("warm", rolling[0]["size_bytes"])  # the restored replica
        + usd_month("hot", rolling[1]["size_bytes"])
        + usd_month("hot", rolling[2]["size_bytes"])
        + usd_month("hot", milestone["size_bytes"])  # the move not made: hot less cold
        - usd_month("cold", milestone["size_bytes"])
    )
    assert divergence["usd_month"] == pytest.approx(expected, rel=1e-12)
    # a person deleted step 3: that would-be delete has a real counterpart
    assert {(d["checkpoint_id"], d["kind"]) for d in divergence["only_shadow"]} == {
        (rolling[0]["id"], "delete"),
        (rolling[1]["id"], "delete"),
        (milestone["id"], "move"),
        (history["final"]["id"], "copy"),
    }
    (enforced,) = divergence["only_enforced"]
    assert enforced["checkpoint_id"] == history["debug"][0]["id"]
    assert enforced["rule"] == "default/debug-keep-1" and enforced["kind"] == "delete"
    assert enforced["step"] == 11 and enforced["run_id"] == history["run"]["id"]
    entry = divergence["only_shadow"][0]
    assert set(entry) == {
        "checkpoint_id",
        "run_id",
        "step",
        "kind",
        "from_tier",
        "to_tier",
        "rule",
        "at",
    }
    regrets = {r["checkpoint_id"]: r for r in answer["regrets"]}
    assert set(regrets) == {rolling[0]["id"], rolling[1]["id"]}
    restored = regrets[rolling[0]["id"]]
    assert restored["use"] == "restored" and restored["action"] == "delete"
    assert instant(restored["would_delete_at"]) == history["recorded_at"]
    assert instant(restored["used_at"]) == instant(history["restore"]["created_at"])
    assert restored["step"] == 1 and restored["run_id"] == history["run"]["id"]
    assert regrets[rolling[1]["id"]]["use"] == "pinned"


def test_since_narrows_every_part(client: TestClient, history: dict[str, Any]) -> None:
    later = shadow(client, since=iso(history["after_sweep"]))
    assert later["actions"] == [] and later["regrets"] == []
    assert later["divergence"] == {
        "bytes_freed": 0,
        "usd_month": 0.0,
        "only_shadow": [],
        "only_enforced": [],
    }
    assert len(shadow(client, since=iso(history["recorded_at"]))["actions"]) == 5


def test_unknown_policy_and_bad_since(client: TestClient, history: dict[str, Any]) -> None:
    assert_problem(client.get("/v1/policies/nobody/shadow"), 404, "name")
    for bad in ("yesterday", "2026-13-01T00:00:00Z"):
        assert_problem(
            client.get("/v1/policies/candidate/shadow", params={"since": bad}), 422, "since"
        )
    assert_problem(client.get("/v1/policies/candidate/shadow", params={"sinse": "x"}), 422, "sinse")


def test_metrics_show_each_shadow_policy(client: TestClient, history: dict[str, Any]) -> None:
    answer = shadow(client)
    text = client.get("/metrics").text
    found = {
        sample.name: sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("ckpt_shadow_")
    }
    for name in found:
        assert found[name].labels == {"policy": "candidate"}
    figures = {name: sample.value for name, sample in found.items()}
    divergence = answer["divergence"]
    assert figures == {
        "ckpt_shadow_bytes_freed": divergence["bytes_freed"],
        "ckpt_shadow_usd_month": pytest.approx(divergence["usd_month"], rel=1e-12),
        "ckpt_shadow_only_shadow": len(divergence["only_shadow"]),
        "ckpt_shadow_only_enforced": len(divergence["only_enforced"]),
        "ckpt_shadow_regrets": len(answer["regrets"]),
    }


def test_switching_to_enforce_keeps_the_history(
    client: TestClient, app: FastAPI, history: dict[str, Any]
) -> None:
    before = shadow(client)
    put_policy(client, SHADOW.replace("mode: shadow", "mode: enforce"))
    sweep_now(client)

    after = shadow(client)

    assert after["mode"] == "enforce" and after["actions"] == before["actions"]
    assert len(shadow_rows(app)) == 5  # an enforced policy records nothing more
    real = {(a["checkpoint_id"], a["kind"]) for a in ledger(client) if a["rule"] != "manual"}
    assert (history["milestone"]["id"], "move") in real  # the candidate governs now
    only_shadow = {d["checkpoint_id"] for d in after["divergence"]["only_shadow"]}
    assert history["milestone"]["id"] not in only_shadow  # it has a real counterpart now
    assert "ckpt_shadow_bytes_freed{" not in client.get("/metrics").text


def test_no_shadow_policy_no_shadow_metrics(client: TestClient) -> None:
    put_policy(client, ENFORCED)
    text = client.get("/metrics").text
    assert "# TYPE ckpt_shadow_regrets gauge" in text
    assert "ckpt_shadow_regrets{" not in text


# --- bounded tokens -------------------------------------------------------------------------


@pytest.fixture
def auth_app(auth_settings: Settings, clean_engine: Engine) -> FastAPI:
    return create_app(priced(auth_settings), engine=clean_engine, roles=NO_BACKGROUND)


def test_a_bounded_token_reads_its_own_projects_runs(
    auth_app: FastAPI, admin_client: TestClient, data_dir: Path
) -> None:
    put_policy(admin_client, SHADOW.replace("projects: [proj]", "projects: ['*']"))
    runs = {p: make_run(admin_client, p) for p in ("proj-a", "proj-b")}
    for run in runs.values():
        for s in (1, 2, 3):
            place_checkpoint(admin_client, data_dir, run, s)
    sweep_now(admin_client)
    _, secret = issue_token(auth_app, name="reader", scopes=("read",), projects=("proj-a",))

    seen = shadow(token_client(auth_app, secret))

    assert {a["run_id"] for a in seen["actions"]} == {runs["proj-a"]["id"]}
    assert {a["run_id"] for a in shadow(admin_client)["actions"]} == {
        r["id"] for r in runs.values()
    }


def test_a_shadow_default_is_no_default_for_a_forecast(client: TestClient) -> None:
    """A forecast without a policy uses the one named `default`, which stands for the runs
    no other policy governs: in shadow mode it governs none, so it is refused; named, it
    is forecast like any other."""
    put_policy(client, ENFORCED.replace("name: default\n", "name: default\nmode: shadow\n"))
    body = {"checkpoint_bytes": 10**9, "run_days": 3, "schedule": {"rolling": "6h"}}
    refused = assert_problem(client.post("/v1/forecast", json=body), 422, "policy")
    assert "shadow" in refused["detail"]
    named = client.post("/v1/forecast", json={**body, "policy": "default"})
    assert named.status_code == 200, named.text


# --- the real plan's protections, and the cost of a sweep ----------------------------------


@pytest.mark.usefixtures("policies")
def test_a_provider_lock_holds_back_a_would_be_delete_as_it_holds_a_real_one(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    run = make_run(client)
    made = [place_checkpoint(client, data_dir, run, s) for s in (1, 2, 3)]
    until = datetime.now(UTC) + timedelta(days=2)
    with session_scope(app.state.session_factory) as session:
        session.execute(
            update(Checkpoint)
            .where(Checkpoint.id == made[0]["id"])
            .values(locked_until=until, lock_reason="retained by Object Lock")
        )
    sweep_now(client)
    assert shadow_rows(app) == []

    periodic_sweep(app, until + timedelta(seconds=1))  # due again when the lock ends

    assert [(r.checkpoint_id, r.kind) for r in shadow_rows(app)] == [(made[0]["id"], "delete")]


def test_without_a_shadow_policy_a_sweep_reads_nothing_more(
    client: TestClient, app: FastAPI, data_dir: Path
) -> None:
    """The statements of a full sweep over five runs: with a shadow policy, one read of the
    shadow ledger more, and one insert when it found something; none per run."""
    put_policy(client, ENFORCED)
    for n in range(5):
        run = make_run(client, name=f"run-{n}")
        for s in (1, 2, 3, 4):
            place_checkpoint(client, data_dir, run, s)
    engine: Engine = app.state.engine

    def statements() -> int:
        seen: list[str] = []

        def count(*args: Any) -> None:
            seen.append(args[2])

        event.listen(engine, "before_cursor_execute", count)
        try:
            sweep_now(client)
        finally:
            event.remove(engine, "before_cursor_execute", count)
        return len(seen)

    client.post("/v1/plan", json={})  # each stored policy is validated once, then kept
    without = statements()
    put_policy(client, SHADOW)
    client.post("/v1/plan", json={})
    first = statements()
    again = statements()

    assert len(shadow_rows(app)) == 5 * 2
    # PostgreSQL's bulk insert goes through the driver (app.db.bulk): not seen here. There,
    # a whole catalog's plan without shadows first sums the runs' totals (is it large
    # enough to split across processes?); a shadow policy's plan is never split
    insert, sizing = (1, 0) if engine.dialect.name == "sqlite" else (0, 1)
    assert (first, again) == (without + 1 + insert - sizing, without + 1 - sizing)
