"""`ckpt policies list` shows each policy's mode, and `ckpt policies shadow NAME` what a
shadow policy would have done, as an admin reads them against a real service."""

from __future__ import annotations

import json

from tests.builders import place_checkpoint
from tests.integration.cli_service import Service

SHADOW = """\
name: tighter
mode: shadow
priority: 10
rules:
  - name: rolling-keep-1
    class: rolling
    keep_last: 1
    action: delete
"""


def test_a_shadow_policy_s_would_be_deletes_are_listed_and_nothing_is_deleted(
    catalog: Service,
) -> None:
    with catalog.http() as client:
        stored = client.put(
            "/v1/policies/tighter", content=SHADOW, headers={"content-type": "application/yaml"}
        )
        assert stored.status_code == 200, stored.text
        place_checkpoint(client, catalog.data_dir, catalog.run, 6)
        swept = client.post("/v1/sweeps", json={"run_id": catalog.run["id"]})
        assert swept.status_code == 202, swept.text

    listed = catalog.invoke("policies", "list", columns=200)
    assert listed.exit_code == 0, listed.output
    cells = [line.strip("│ ").split() for line in listed.output.splitlines()]
    modes = {c[0]: c[2] for c in cells if c and c[0] in ("default", "tighter")}
    assert modes == {"default": "enforce", "tighter": "shadow"}

    shown = catalog.invoke("policies", "shadow", "tighter", columns=200)
    assert shown.exit_code == 0, shown.output
    assert "tighter (shadow): 5 would-be action(s)" in shown.output
    assert "tighter/rolling-keep-1" in shown.output and "regrets: none" in shown.output

    as_json = catalog.invoke("policies", "shadow", "tighter", "--json")
    body = json.loads(as_json.stdout)
    assert sorted(a["step"] for a in body["actions"]) == [1, 2, 3, 4, 5]
    assert {a["kind"] for a in body["actions"]} == {"delete"}
    # the policy in force (the shipped default, keep 3) deleted steps 1-3 for real; the
    # shadow's deletes of 4 and 5 are its own, and only the catalog's own actions ran
    assert {a["step"] for a in body["divergence"]["only_shadow"]} == {4, 5}
    deleted = {checkpoint for checkpoint, kind, _, _ in catalog.actions() if kind == "delete"}
    assert catalog.ckpts[4]["id"] not in deleted and catalog.ckpts[5]["id"] not in deleted

    missing = catalog.invoke("policies", "shadow", "no-such-policy")
    assert missing.exit_code != 0
    assert "no-such-policy" in missing.output
