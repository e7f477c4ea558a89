"""A restore says what it will cost before anyone pays: the action's reason carries the
retrieval fee of the archive it reads, the egress when the bytes leave the provider's
network, and the requests (DESIGN section 7b)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from app.cost.prices import catalog_quote
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from tests.builders import make_run, place_checkpoint

SHARD = 5_000_000  # bytes; two shards


@pytest.fixture
def client(
    settings: Settings, data_dir: Path, tmp_path: Path, clean_engine: Engine
) -> Iterator[TestClient]:
    tiers_file = tmp_path / "tiers.yaml"
    tiers_file.write_text(
        "tiers:\n"
        f"  - {{name: hot, url: 'file://{(data_dir / 'hot').resolve()}'}}\n"
        f"  - {{name: warm, url: 'file://{(data_dir / 'warm').resolve()}'}}\n"
        f"  - name: deep\n    url: 'file://{(data_dir / 'deep').resolve()}'\n"
        "    price: {catalog: aws/DEEP_ARCHIVE}\n"
    )
    app = create_app(
        settings.model_copy(update={"tiers_file": tiers_file}),
        engine=clean_engine,
        roles=NO_BACKGROUND,
    )
    with TestClient(app) as test_client:
        yield test_client


def restore_reason(client: TestClient, checkpoint_id: str, tier: str) -> str:
    response = client.post(f"/v1/checkpoints/{checkpoint_id}/restore", json={"tier": tier})
    assert response.status_code == 202, response.text
    reason: str = response.json()["reason"]
    return reason


def test_a_restore_out_of_an_archive_names_its_retrieval_egress_and_requests(
    client: TestClient, data_dir: Path
) -> None:
    run = make_run(client)
    files = {f"shard-{i}.bin": bytes([i]) * SHARD for i in range(2)}
    deep = place_checkpoint(client, data_dir, run, 100, "final", tier="deep", files=files)
    quote = catalog_quote("aws/DEEP_ARCHIVE")
    assert quote.retrieval_gb > 0 and quote.egress_gb > 0  # what the figures below rely on

    reason = restore_reason(client, deep["id"], "hot")
    gigabytes = 2 * SHARD / 1e9
    retrieval = gigabytes * quote.retrieval_gb
    egress = gigabytes * quote.egress_gb  # from AWS's network to a local directory
    requests = 2 * quote.read_requests_per_1000 / 1000  # two objects read; hot writes free
    assert reason.startswith("restore to hot requested; one-off charges about $")
    assert f"retrieval ${retrieval:.2g}" in reason
    assert f"egress ${egress:.2g}" in reason
    if requests:
        assert f"requests ${requests:.2g}" in reason
    assert f"about ${retrieval + egress + requests:.2g} " in reason


def test_a_restore_between_unpriced_tiers_says_nothing_of_money(
    client: TestClient, data_dir: Path
) -> None:
    run = make_run(client)
    warm = place_checkpoint(client, data_dir, run, 100, "final", tier="warm")
    assert restore_reason(client, warm["id"], "hot") == "restore to hot requested"
