"""The policy editor's backtest panel, in a real browser against a real service: a draft
replayed over a run the catalog really had (checkpoints registered at back-dated
`created_at`, the run ended, one checkpoint pinned afterwards), beside what was stored."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from playwright.sync_api import Page, Route, expect

from tests.builders import put_policy, write_checkpoint
from tests.console.conftest import GB, Catalog, Recorder, sign_in

PROJECT = "history"
POLICY = "history-trim"
# the saved version keeps all of the run's six rolling checkpoints: it never deletes
SAVED = f"""name: {POLICY}
description: trims the rolling checkpoints of the history project
applies_to: {{projects: [{PROJECT}]}}
priority: 20
rules:
  - name: rolling-keep
    class: rolling
    keep_last: 6
    action: delete
"""
STEPS = (100, 200, 300, 400, 500, 600)
PINNED = 200
MINUS = "\u2212"  # the console's minus sign


@dataclass(frozen=True)
class History:
    """A finished run of six rolling checkpoints, one a day from 12 days ago, governed by
    keep-all; step 200 pinned today (after a stricter policy would have deleted it)."""

    run: dict[str, Any]
    checkpoints: dict[int, dict[str, Any]]
    since: date


@pytest.fixture(scope="module")
def history(catalog: Catalog) -> History:
    service = catalog.service
    first = datetime.now(UTC) - timedelta(days=12)
    with service.admin() as admin:
        made = admin.post(
            "/v1/runs", json={"project": PROJECT, "name": "long-run", "policy": "keep-all"}
        )
        assert made.status_code == 201, made.text
        run = made.json()
        checkpoints: dict[int, dict[str, Any]] = {}
        for i, step in enumerate(STEPS):
            relative = f"{PROJECT}/long-run/step-{step}"
            uri = write_checkpoint(service.tier_dir("hot"), relative, {"model.safetensors": b"w"})
            # sparse: 50 GB on the bill, nothing on the disk
            os.truncate(service.tier_dir("hot") / relative / "model.safetensors", 50 * GB)
            body = {
                "step": step,
                "class": "rolling",
                "uri": uri,
                "created_at": (first + timedelta(days=i)).isoformat(),
            }
            registered = admin.post(f"/v1/runs/{run['id']}/checkpoints", json=body)
            assert registered.status_code == 201, registered.text
            checkpoints[step] = registered.json()
        ended = admin.patch(f"/v1/runs/{run['id']}", json={"status": "completed"})
        assert ended.status_code == 200, ended.text
        pinned = admin.post(
            f"/v1/checkpoints/{checkpoints[PINNED]['id']}/pin", json={"reason": "a paper"}
        )
        assert pinned.status_code == 200, pinned.text
        put_policy(admin, SAVED)
    return History(run, checkpoints, (first - timedelta(days=2)).date())


def usd(value: float) -> str:
    """As the console writes money (ui.js `usd`)."""
    digits = 2 if abs(value) < 10 and value != 0 else 0
    sign = MINUS if value < 0 else ""
    return f"{sign}${abs(value):,.{digits}f}"


def open_editor(page: Page, catalog: Catalog) -> None:
    sign_in(page, catalog)
    page.goto(f"{catalog.url}/console/#/policies/{POLICY}")
    expect(page.get_by_role("heading", name=f"Policy {POLICY}")).to_be_visible()


def test_a_stricter_draft_is_backtested_with_its_regrets(
    recorded: tuple[Page, Recorder],
    catalog: Catalog,
    history: History,
) -> None:
    page, _ = recorded
    open_editor(page, catalog)
    editor = page.get_by_label("Policy (YAML)")
    editor.fill(editor.input_value().replace("keep_last: 6", "keep_last: 1"))
    panel = page.get_by_role("region", name="Backtest")
    panel.get_by_label("Backtest on").select_option(PROJECT)
    panel.get_by_label("Since (UTC day)").fill(history.since.isoformat())

    # the request is held until the busy state has been seen; then the service's answer
    # is handed to the page, and kept to check the figures shown against
    held: list[Route] = []
    page.route("**/v1/backtest", lambda route: held.append(route))
    run = panel.get_by_role("button", name="Run backtest")
    run.click()
    expect(panel.get_by_text("Replaying the catalog's history under the draft…")).to_be_visible()
    expect(run).to_be_disabled()
    # the busy state can show before Playwright has handed the request to the route:
    # wait for that (each wait lets it deliver its events), then for nothing else
    deadline = time.monotonic() + 30
    while not held:
        assert time.monotonic() < deadline, "the backtest request never reached the route"
        page.wait_for_timeout(20)
    assert len(held) == 1
    sent = held[0].request.post_data_json
    assert (
        sent is not None and sent["policy"]["rules"][0]["keep_last"] == 1
    )  # the draft, inline, unsaved
    response = held[0].fetch()
    answer = response.json()
    held[0].fulfill(response=response)
    assert response.status == 200 and answer["savings_usd"] > 0

    saving = panel.get_by_text(re.compile(r"^Saves "))
    # the window starts with the history's first day, even asked from before it
    assert answer["since"][:10] >= history.since.isoformat()
    expect(saving).to_have_text(
        f"Saves {usd(answer['savings_usd'])} from {answer['since'][:10]} to {answer['until'][:10]}"
    )
    expect(run).to_be_enabled()
    # the one regret is marked on both charts, on the day the draft would have deleted it
    (regret,) = answer["regrets"]
    deleted_on = regret["would_delete_at"][:10]
    for name in ("Bytes stored by day", "Storage $/month by day"):
        chart = panel.get_by_role("img", name=name)
        expect(chart).to_be_visible()
        expect(chart.locator("path[data-series]")).to_have_count(2)
        marks = chart.locator("line[data-mark='regret']")
        expect(marks).to_have_count(1)
        expect(marks.locator("title")).to_have_text(
            f"1 regret on {deleted_on}: step {PINNED} of {history.run['id']} (delete, then pinned)"
        )
        legend = chart.locator("xpath=following-sibling::div[@class='legend']")
        expect(legend).to_have_text(
            f"draft {POLICY}what happened"
            "dashed: the draft deleted or moved a checkpoint used later (a regret)"
        )
    totals = panel.get_by_role("table", name="Backtest totals")
    expect(totals.get_by_role("row", name=re.compile("what happened"))).to_contain_text(
        usd(answer["actual"]["total_usd"])
    )

    regrets = panel.get_by_role("table", name="Regrets")
    expect(regrets.get_by_role("row")).to_have_count(2)  # the heading and the pinned step
    row = regrets.get_by_role("row").nth(1)
    pinned = history.checkpoints[PINNED]
    expect(row).to_contain_text(pinned["id"])
    expect(row.get_by_role("link", name=history.run["id"])).to_be_visible()
    expect(row.get_by_role("cell", name=str(PINNED), exact=True)).to_be_visible()
    expect(row.get_by_role("cell", name="pinned", exact=True)).to_be_visible()
    expect(row.get_by_role("cell", name="delete", exact=True)).to_be_visible()

    # an edit after the backtest says the result is no longer the draft's
    editor.fill(editor.input_value().replace("keep_last: 1", "keep_last: 2"))
    expect(panel.get_by_text("The draft has changed since this backtest")).to_be_visible()


def test_the_saved_policy_has_no_regrets(
    recorded: tuple[Page, Recorder], catalog: Catalog, history: History
) -> None:
    page, _ = recorded
    open_editor(page, catalog)
    panel = page.get_by_role("region", name="Backtest")
    panel.get_by_label("Backtest on").select_option(PROJECT)
    panel.get_by_role("button", name="Run backtest").click()
    expect(panel.get_by_text("Regrets (0)")).to_be_visible()
    expect(panel.get_by_text("No regrets")).to_be_visible()
    chart = panel.get_by_role("img", name="Bytes stored by day")
    expect(chart.locator("line[data-mark]")).to_have_count(0)
    legend = chart.locator("xpath=following-sibling::div[@class='legend']")
    expect(legend).not_to_contain_text("regret")
    expect(panel.get_by_role("table", name="Regrets")).to_have_count(0)
    # keeping the six it kept, the draft stores what was stored: nothing saved
    expect(panel.get_by_text(re.compile(r"^Saves \$0(\.00)? from "))).to_be_visible()


def test_an_invalid_or_unparsed_draft(
    recorded: tuple[Page, Recorder], catalog: Catalog, history: History
) -> None:
    page, _ = recorded
    open_editor(page, catalog)
    editor = page.get_by_label("Policy (YAML)")
    text = editor.input_value()
    panel = page.get_by_role("region", name="Backtest")
    run = panel.get_by_role("button", name="Run backtest")

    editor.fill(text + "rules: [\n")  # no longer YAML: nothing to send
    expect(run).to_be_disabled()
    expect(panel.get_by_text("The draft does not parse")).to_be_visible()

    editor.fill(text.replace("keep_last: 6", "keep_last: lots"))  # YAML, but no policy
    expect(run).to_be_enabled()
    run.click()
    problem = panel.get_by_role("alert")
    expect(problem).to_contain_text("Refused (422)")
    expect(problem).to_contain_text("keep_last")
    expect(problem).to_contain_text("must be an integer")
    expect(panel.get_by_role("img")).to_have_count(0)
