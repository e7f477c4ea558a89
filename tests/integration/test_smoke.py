from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests.builders import make_run, write_checkpoint


def test_register_and_read_back(client: TestClient, data_dir: Path) -> None:
    run = make_run(client)
    uri = write_checkpoint(data_dir / "hot", "proj/run-1/step-100")
    response = client.post(
        f"/v1/runs/{run['id']}/checkpoints", json={"step": 100, "class": "rolling", "uri": uri}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["class"] == "rolling"
    assert body["tier"] == "hot"
    assert body["size_bytes"] == len(b"weights") + len(b"moments!")
    assert [f["path"] for f in body["files"]] == ["model.pt", "optim/state.pt"]
    again = client.get(f"/v1/checkpoints/{body['id']}")
    assert again.json() == body
