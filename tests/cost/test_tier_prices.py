"""A tier's `price` in the tiers file: figures left out come from the built-in catalog, a
figure set (0 included) wins, `catalog` names an entry; a bad price stops start-up with a
message naming the file and field. GET /v1/tiers shows the effective price, and the `ckpt`
command carries the cost commands."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from typer.testing import CliRunner

from app.cli import cli
from app.cost.prices import effective_price
from app.domain.tier import Price
from app.main import NO_BACKGROUND, create_app
from app.settings import Settings
from app.tiers_config import TiersFileError, parse_tiers_file


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("CKPT_"):
            monkeypatch.delenv(name)


def tiers_file(directory: Path, text: str) -> Path:
    path = directory / "tiers.yaml"
    path.write_text(text)
    return path


def test_figures_left_out_are_the_catalogs(tmp_path: Path) -> None:
    path = tiers_file(
        tmp_path,
        "tiers:\n"
        "  - {name: hot, url: 's3://b/hot'}\n"
        "  - name: cold\n"
        "    url: s3://b/cold\n"
        "    storage_class: GLACIER_IR\n"
        "    price: {storage_gb_month: 0.0035, min_object_bytes: 0}\n",
    )
    hot, cold = parse_tiers_file(path)

    assert hot.price == Price()  # nothing set: every figure from the catalog
    assert effective_price(hot).storage_gb_month == 0.023  # aws/STANDARD
    assert cold.price == Price(storage_gb_month=0.0035, min_object_bytes=0)
    quote = effective_price(cold)
    assert (quote.storage_gb_month, quote.min_object_bytes) == (0.0035, 0)  # the tier's own
    assert (quote.retrieval_gb, quote.min_storage_days) == (0.03, 90)  # aws/GLACIER_IR's
    assert quote.given == {"storage_gb_month", "min_object_bytes"}


def test_a_tier_names_its_catalog_entry_in_any_case(tmp_path: Path) -> None:
    path = tiers_file(
        tmp_path,
        "tiers:\n"
        "  - name: cool\n"
        "    url: s3://b/p\n"
        "    endpoint_url: http://127.0.0.1:10000\n"
        "    price: {catalog: azure/cool, egress_gb: 0.05}\n",
    )
    (cool,) = parse_tiers_file(path)

    assert cool.price.catalog == "azure/COOL"
    quote = effective_price(cool)
    assert quote.catalog == "azure/COOL" and quote.provider == "azure"
    assert (quote.storage_gb_month, quote.egress_gb, quote.min_storage_days) == (0.01, 0.05, 30)


@pytest.mark.parametrize(
    ("price", "expected"),
    [
        ("{catalog: aws/NOPE}", ["tiers[0].price.catalog", "no built-in price catalog entry"]),
        ("{catalog: STANDARD}", ["tiers[0].price.catalog", "aws/STANDARD"]),
        ("{min_object_bytes: -1}", ["tiers[0].price.min_object_bytes"]),
        ("{write_requests_per_1000: .nan}", ["tiers[0].price.write_requests_per_1000"]),
        ("{read_requests_per_1000: cheap}", ["tiers[0].price.read_requests_per_1000"]),
        ("{min_storage_days: 1.5}", ["tiers[0].price.min_storage_days"]),
        ("{storage: 1}", ["tiers[0].price.storage"]),
    ],
)
def test_a_bad_price_names_the_file_and_field(
    tmp_path: Path, price: str, expected: list[str]
) -> None:
    path = tiers_file(tmp_path, f"tiers:\n  - {{name: hot, url: 's3://b/p', price: {price}}}\n")

    with pytest.raises(TiersFileError) as raised:
        parse_tiers_file(path)

    message = str(raised.value)
    assert message.startswith(f"tiers file {path}: ")
    for part in expected:
        assert part in message


def test_ckpt_refuses_to_start_on_a_bad_price(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiers_file(
        tmp_path, "tiers:\n  - {name: hot, url: 's3://b/p', price: {catalog: aws/NOPE}}\n"
    )
    monkeypatch.setenv("CKPT_TIERS_FILE", str(path))
    monkeypatch.setenv("CKPT_DATABASE_URL", f"sqlite:///{tmp_path / 'ckpt.db'}")

    for command in (["migrate"], ["worker", "--once"]):  # the commands that read tiers
        result = CliRunner().invoke(cli, command)

        assert result.exit_code == 2
        assert "tiers[0].price.catalog" in result.output
    assert not (tmp_path / "ckpt.db").exists()


def test_the_ckpt_command_has_the_cost_commands() -> None:
    result = CliRunner().invoke(cli, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command in ("report", "forecast", "planner"):
        assert command in result.output


@pytest.fixture
def tiers_client(tmp_path: Path, database_url: str, clean_engine: Engine) -> Iterator[TestClient]:
    path = tiers_file(
        tmp_path,
        f"tiers:\n"
        f"  - {{name: hot, url: 'file://{tmp_path.resolve()}/hot'}}\n"
        f"  - {{name: ia, url: 's3://b/ia', storage_class: STANDARD_IA,"
        f" price: {{storage_gb_month: 0.01}}}}\n"
        f"  - {{name: nearline, url: 'gs://b/n', storage_class: NEARLINE}}\n",
    )
    settings = Settings(
        database_url=database_url,
        data_dir=tmp_path / "unused",
        tiers_file=path,
        policies_dir=tmp_path / "no-policies",
        auth="off",
    )
    with TestClient(create_app(settings, engine=clean_engine, roles=NO_BACKGROUND)) as client:
        yield client


def test_get_tiers_shows_the_effective_price(tiers_client: TestClient) -> None:
    response = tiers_client.get("/v1/tiers")
    assert response.status_code == 200, response.text
    hot, ia, nearline = (t["price"] for t in response.json()["items"])

    assert hot["storage_gb_month"] == 0 and hot["provider"] == "local"
    assert "operator" in hot["note"]
    assert ia["storage_gb_month"] == 0.01 and ia["given"] == ["storage_gb_month"]
    assert (ia["retrieval_gb"], ia["min_storage_days"]) == (0.01, 30)  # aws/STANDARD_IA
    assert ia["catalog"] == "aws/STANDARD_IA"
    assert nearline["catalog"] == "gcs/NEARLINE" and nearline["storage_gb_month"] == 0.01
    source = nearline["sources"]["storage_gb_month"]
    assert source["url"].startswith("https://cloud.google.com/") and source["as_of"]
