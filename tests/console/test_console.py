"""What an admin does in the console, in a real browser, checked against the service."""

from __future__ import annotations

import re

import httpx
from playwright.sync_api import Page, expect

from tests.console.conftest import Catalog, Recorder, sign_in


def test_overview_shows_cost_and_the_held_sweep(
    recorded: tuple[Page, Recorder], catalog: Catalog
) -> None:
    page, _ = recorded
    sign_in(page, catalog)
    expect(page.get_by_text("signed in · admin")).to_be_visible()
    bars = page.locator("section[aria-label='Cost by project'] svg[data-chart='bars'] rect")
    expect(bars).to_have_count(3)  # vision, llm, sandbox-a
    held = page.locator(f"[data-sweep='{catalog.held_sweep}']")
    expect(held).to_contain_text("5 deletes held")
    expect(held).to_contain_text("rolling-keep-3")


def run_page(page: Page, catalog: Catalog, run: str) -> None:
    page.goto(f"{catalog.url}/console/#/runs/{catalog.runs[run]['id']}")
    expect(page.get_by_role("heading", name=run, exact=True)).to_be_visible()


def test_find_a_run_open_it_and_pin_a_checkpoint(
    recorded: tuple[Page, Recorder], catalog: Catalog, admin_api: httpx.Client
) -> None:
    page, _ = recorded
    sign_in(page, catalog)
    page.get_by_role("link", name="Runs").click()
    # the overview's "Cost by project" is still on screen until the Runs page replaces it
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    page.get_by_label("Project", exact=True).fill("llm")
    page.get_by_label("Project", exact=True).press("Enter")  # the keyboard submits the filter
    runs = page.get_by_role("table", name="Runs")
    expect(runs.get_by_role("row")).to_have_count(2)  # the heading and gpt-small
    runs.get_by_role("link", name="gpt-small").click()
    expect(page.locator("svg[data-chart='steps'] circle")).to_have_count(4)
    page.get_by_role("button", name="Pin step 1000").click()
    page.get_by_label("Reason").fill("the paper's results")
    page.get_by_role("button", name="Pin", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Step 1000 is pinned (the paper's results)")
    checkpoint = catalog.checkpoints[("gpt-small", 1000)]
    stored = admin_api.get(f"/v1/checkpoints/{checkpoint['id']}").json()
    assert stored["pinned"] is True and stored["pin_reason"] == "the paper's results"
    # the page reloads to show the pin, and the service's answer stays on screen
    expect(page.get_by_role("button", name="Unpin step 1000")).to_be_visible()
    expect(page.get_by_role("status")).to_contain_text("Step 1000 is pinned (the paper's results)")


def test_restore_onto_hot_and_watch_the_action_finish(
    recorded: tuple[Page, Recorder], catalog: Catalog, admin_api: httpx.Client
) -> None:
    page, _ = recorded
    sign_in(page, catalog)
    run_page(page, catalog, "gpt-small")
    page.get_by_role("button", name="Restore step 2000").click()
    page.get_by_label("Onto tier").select_option("hot")
    page.get_by_role("button", name="Restore", exact=True).click()
    finished = page.get_by_text(re.compile(r"Action \S+ \(restore\) ended done"))
    expect(finished).to_be_visible(timeout=60_000)
    checkpoint = catalog.checkpoints[("gpt-small", 2000)]
    stored = admin_api.get(f"/v1/checkpoints/{checkpoint['id']}").json()
    assert "hot" in {location["tier"] for location in stored["locations"]}


def test_edit_a_policy_see_the_mistake_fix_preview_and_save(
    recorded: tuple[Page, Recorder], catalog: Catalog, admin_api: httpx.Client
) -> None:
    page, _ = recorded
    sign_in(page, catalog)
    page.goto(f"{catalog.url}/console/#/policies/nightly")
    editor = page.get_by_label("Policy (YAML)")
    text = editor.input_value()
    assert "keep_last: 5" in text
    editor.fill(text.replace("keep_last: 5", "keep_last: lots"))
    problem = page.locator("#policy-check")
    expect(problem).to_contain_text("rules[0] (rolling-keep-5).keep_last")
    expect(problem).to_contain_text("must be an integer")
    editor.fill(text.replace("keep_last: 5", "keep_last: 1"))
    expect(problem).to_have_text("Valid.")
    page.get_by_label("Preview on").select_option("vision")
    page.get_by_role("button", name="Preview changes").click()
    # against the saved version (keep 5 of resnet-50's 8): 4 more deletes
    preview = page.locator("#policy-preview")
    expect(preview).to_contain_text("4 actions added, 0 removed")
    expect(preview.get_by_role("table", name="Actions added").get_by_role("row")).to_have_count(5)
    page.get_by_role("button", name="Save").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("would delete 7 checkpoints")
    dialog.get_by_role("button", name="Save anyway").click()
    expect(page.get_by_role("status").filter(has_text="Saved nightly")).to_be_visible()
    stored = admin_api.get("/v1/policies/nightly").json()["policy"]
    assert stored["rules"][0]["keep_last"] == 1


def test_approve_one_held_delete_of_a_sweep(
    recorded: tuple[Page, Recorder], catalog: Catalog, admin_api: httpx.Client
) -> None:
    page, _ = recorded
    sign_in(page, catalog)
    sweep = page.locator(f"[data-sweep='{catalog.held_sweep}']")
    sweep.get_by_text("Show the 5 actions").click()
    sweep.get_by_role("button", name="Approve the delete of step 100").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Step 100")
    dialog.get_by_role("button", name="Delete", exact=True).click()
    expect(
        page.get_by_text(re.compile(r"Approved: the action is now (pending|running|done)"))
    ).to_be_visible()
    run_id = catalog.runs["resnet-50"]["id"]
    held = admin_api.get("/v1/actions", params={"state": "held", "run_id": run_id}).json()
    assert sorted(a["step"] for a in held["items"]) == [200, 300, 400, 500]
    expect(page.locator(f"[data-sweep='{catalog.held_sweep}']")).to_contain_text("4 deletes held")


def test_approve_a_held_sweep_and_see_its_deletes_run(
    recorded: tuple[Page, Recorder], catalog: Catalog, admin_api: httpx.Client
) -> None:
    page, _ = recorded
    run_id = catalog.runs["resnet-50"]["id"]
    waiting = len(
        admin_api.get("/v1/actions", params={"state": "held", "run_id": run_id}).json()["items"]
    )
    assert waiting > 0
    sign_in(page, catalog)
    sweep = page.locator(f"[data-sweep='{catalog.held_sweep}']")
    sweep.get_by_role("button", name=f"Approve all {waiting}").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(f"{waiting} checkpoints")
    dialog.get_by_role("button", name=f"Delete {waiting}").click()
    expect(page.get_by_text(f"Approved: {waiting} deletes released.")).to_be_visible()
    page.goto(f"{catalog.url}/console/#/ledger?kind=delete&run_id={run_id}")
    ledger = page.get_by_role("table", name="Ledger")
    expect(ledger.get_by_role("row")).to_have_count(6)  # the heading and the run's 5 deletes
    # the worker runs them: filter again until they are done (the ledger shows what it
    # was given; a person presses Filter again)
    for _ in range(60):
        done = page.get_by_role("table", name="Ledger").locator(".badge.done")
        if done.count() == 5:
            break
        page.get_by_role("button", name="Filter").click()
        page.wait_for_timeout(500)
    expect(page.get_by_role("table", name="Ledger").locator(".badge.done")).to_have_count(5)
    states = [c["state"] for c in admin_api.get(f"/v1/runs/{run_id}/checkpoints").json()["items"]]
    assert sorted(states) == ["active"] * 3 + ["trashed"] * 5


def test_a_forecast_is_drawn(recorded: tuple[Page, Recorder], catalog: Catalog) -> None:
    page, _ = recorded
    sign_in(page, catalog)
    page.get_by_role("link", name="Forecast").click()
    page.get_by_label("Checkpoint size (GB)").fill("500")
    page.get_by_label("Run days").fill("20")
    page.get_by_label("Policy").select_option("default")
    page.get_by_role("button", name="Forecast").click()
    lines = page.locator("svg[data-chart='lines'] path[data-series]")
    expect(lines).to_have_count(2)
    assert lines.nth(0).get_attribute("data-series") == "policy default"
    assert lines.nth(1).get_attribute("data-series") == "keep everything"
    expect(page.get_by_text(re.compile(r"Saves \$[\d,.]+ over 50 days"))).to_be_visible()


def test_a_read_token_sees_no_write_buttons(
    recorded: tuple[Page, Recorder], catalog: Catalog
) -> None:
    page, _ = recorded
    sign_in(page, catalog, catalog.read_token)
    expect(page.get_by_text("signed in · read only")).to_be_visible()
    expect(page.get_by_role("region", name="Held deletes")).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("Approve|Scan"))).to_have_count(0)
    run_page(page, catalog, "resnet-50")
    expect(page.get_by_role("table", name="Checkpoints")).to_be_visible()
    expect(
        page.get_by_role("button", name=re.compile("Pin|Unpin|Delete|Undelete|Restore"))
    ).to_have_count(0)
    page.goto(f"{catalog.url}/console/#/policies/default")
    expect(page.get_by_label("Policy (YAML)")).not_to_be_editable()
    expect(page.get_by_role("button", name="Save")).to_have_count(0)
    expect(page.get_by_role("link", name="New policy")).to_have_count(0)
    page.goto(f"{catalog.url}/console/#/audit")
    expect(page.get_by_role("alert")).to_contain_text("admin scope")


def test_a_revoked_token_goes_back_to_the_form(
    recorded: tuple[Page, Recorder], catalog: Catalog, admin_api: httpx.Client
) -> None:
    page, _ = recorded
    made = admin_api.post(
        "/v1/tokens", json={"name": "soon-gone", "scopes": ["admin"], "projects": ["*"]}
    )
    token = made.json()["token"]
    sign_in(page, catalog, token)
    assert admin_api.delete(f"/v1/tokens/{made.json()['id']}").status_code == 204
    page.get_by_role("link", name="Runs").click()
    expect(page.get_by_label("API token")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("revoked")
    # the token was kept for this tab only, and is gone from it
    assert page.evaluate("sessionStorage.length") == 0


def test_no_page_asks_another_origin(recorded: tuple[Page, Recorder], catalog: Catalog) -> None:
    page, recorder = recorded
    sign_in(page, catalog)
    for route in (
        "#/",
        "#/runs",
        f"#/runs/{catalog.runs['resnet-50']['id']}",
        "#/policies",
        "#/policies/default",
        "#/policies/new",
        "#/forecast",
        "#/ledger",
        "#/audit",
    ):
        page.goto(f"{catalog.url}/console/{route}")
        expect(page.get_by_text("Loading…")).to_have_count(0)
    assets = {url for url in recorder.urls if "/console/" in url and not url.endswith("/console/")}
    assert any(url.endswith(".css") for url in assets) and any(
        url.endswith(".mjs") for url in assets
    )
    assert recorder.foreign() == []  # (and the fixture checks it again for every test)
    page_answer = httpx.get(f"{catalog.url}/console/")
    assert "default-src 'none'" in page_answer.headers["content-security-policy"]
    assert "connect-src 'self'" in page_answer.headers["content-security-policy"]
