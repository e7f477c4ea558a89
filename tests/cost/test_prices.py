"""The price catalog and a tier's effective price: defaults from its provider and storage
class, every figure the tier sets itself winning. Pure: no I/O beyond the shipped file."""

from __future__ import annotations

import re
from datetime import date

import pytest
from pydantic import ValidationError

from app.cost.prices import (
    FIGURES,
    GB,
    PriceQuote,
    catalog,
    catalog_key,
    catalog_quote,
    effective_price,
    parse_catalog,
    provider_of,
    with_figures,
)
from app.domain.tier import Price, Tier
from tests.cost.helpers import tier

REQUIRED = {
    "aws": {"STANDARD", "STANDARD_IA", "ONEZONE_IA", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE"},
    "gcs": {"STANDARD", "NEARLINE", "COLDLINE", "ARCHIVE"},
    "azure": {"HOT", "COOL", "COLD", "ARCHIVE"},
    "backblaze-b2": {"STANDARD"},
    "wasabi": {"STANDARD"},
    "cloudflare-r2": {"STANDARD"},
}


def test_the_catalog_covers_every_provider_and_class_of_the_issue() -> None:
    for provider, classes in REQUIRED.items():
        for klass in classes:
            assert f"{provider}/{klass}" in catalog(), f"{provider}/{klass}"


def test_every_figure_names_its_source_and_date() -> None:
    for key, entry in catalog().items():
        assert set(entry.figures) == set(FIGURES), key
        assert set(entry.sources) == set(FIGURES), key
        for figure, source in entry.sources.items():
            assert re.match(r"^https://", source.url), (key, figure)
            assert source.covers, (key, figure)
            assert date.fromisoformat(source.as_of) <= date(2026, 12, 31), (key, figure)


@pytest.mark.parametrize(
    ("key", "storage", "retrieval", "minimum_days"),
    [
        ("aws/STANDARD", 0.023, 0.0, 0),  # section 1: $23 per TB-month
        ("aws/STANDARD_IA", 0.0125, 0.01, 30),
        ("aws/ONEZONE_IA", 0.01, 0.01, 30),
        ("aws/GLACIER_IR", 0.004, 0.03, 90),
        ("aws/GLACIER", 0.0036, 0.01, 90),
        ("aws/DEEP_ARCHIVE", 0.00099, 0.02, 180),
        ("gcs/STANDARD", 0.020, 0.0, 0),
        ("gcs/NEARLINE", 0.010, 0.01, 30),
        ("gcs/COLDLINE", 0.004, 0.02, 90),
        ("gcs/ARCHIVE", 0.0012, 0.05, 365),
        ("azure/COOL", 0.01, 0.01, 30),
        ("azure/COLD", 0.0036, 0.03, 90),
        ("azure/ARCHIVE", 0.002, 0.02, 180),
        ("backblaze-b2/STANDARD", 0.006, 0.0, 0),
        ("wasabi/STANDARD", 0.0068262, 0.0, 90),
        ("cloudflare-r2/STANDARD", 0.015, 0.0, 0),
    ],
)
def test_published_list_prices(
    key: str, storage: float, retrieval: float, minimum_days: int
) -> None:
    figures = catalog()[key].figures
    assert figures["storage_gb_month"] == storage
    assert figures["retrieval_gb"] == retrieval
    assert figures["min_storage_days"] == minimum_days


def test_egress_free_providers_charge_no_egress() -> None:
    for key in ("backblaze-b2/STANDARD", "wasabi/STANDARD", "cloudflare-r2/STANDARD"):
        assert catalog()[key].figures["egress_gb"] == 0.0
    assert catalog()["aws/STANDARD"].figures["egress_gb"] == 0.09


@pytest.mark.parametrize(
    ("url", "endpoint", "provider"),
    [
        ("file:///srv/ckpt/hot", None, "local"),
        ("s3://bucket/prefix", None, "aws"),
        ("gs://bucket/prefix", None, "gcs"),
        ("s3://bucket", "https://s3.us-west-004.backblazeb2.com", "backblaze-b2"),
        ("s3://bucket", "https://s3.eu-central-1.wasabisys.com", "wasabi"),
        ("s3://bucket", "https://0123abcd.r2.cloudflarestorage.com", "cloudflare-r2"),
        ("s3://bucket", "https://s3.eu-west-1.amazonaws.com", "aws"),
        ("s3://bucket", "https://storage.googleapis.com", "gcs"),
        ("s3://bucket", "http://127.0.0.1:9000", "s3-compatible"),
        ("s3://bucket", "https://notwasabisys.com", "s3-compatible"),
    ],
)
def test_provider_from_scheme_and_endpoint(url: str, endpoint: str | None, provider: str) -> None:
    assert provider_of(tier(url=url, endpoint_url=endpoint)) == provider


def test_a_tier_gets_its_provider_and_class_defaults() -> None:
    quote = effective_price(tier(storage_class="GLACIER_IR"))
    assert quote.catalog == "aws/GLACIER_IR"
    assert (quote.storage_gb_month, quote.retrieval_gb, quote.min_storage_days) == (0.004, 0.03, 90)
    assert quote.min_object_bytes == 128 * 1024
    assert quote.given == frozenset()
    assert quote.sources["storage_gb_month"].url == "https://aws.amazon.com/s3/pricing/"


def test_without_a_storage_class_the_providers_default_class() -> None:
    assert effective_price(tier()).catalog == "aws/STANDARD"
    assert effective_price(tier(url="gs://b/p")).catalog == "gcs/STANDARD"
    assert effective_price(tier(url="gs://b/p", storage_class="coldline")).catalog == "gcs/COLDLINE"


def test_the_tiers_own_figures_override_the_defaults() -> None:
    quote = effective_price(tier(storage_class="GLACIER_IR", storage_gb_month=0.0035))
    assert quote.storage_gb_month == 0.0035
    assert quote.retrieval_gb == 0.03  # still the catalog's
    assert quote.given == {"storage_gb_month"}
    assert "storage_gb_month" not in quote.sources  # the operator's figure, not a published one
    assert "retrieval_gb" in quote.sources


def test_a_local_tier_costs_nothing_unless_priced() -> None:
    free = effective_price(tier(url="file:///srv/hot"))
    assert free.provider == "local" and free.catalog is None
    assert all(getattr(free, f) == 0 for f in FIGURES)
    assert "operator" in (free.note or "")
    priced = effective_price(tier(url="file:///srv/hot", storage_gb_month=0.05))
    assert priced.storage_gb_month == 0.05


def test_an_unknown_provider_or_class_has_no_defaults_and_says_so() -> None:
    minio = effective_price(tier(endpoint_url="http://127.0.0.1:9000"))
    assert minio.catalog is None and minio.storage_gb_month == 0
    assert "tiers file" in (minio.note or "")
    assert minio.network == "s3-compatible:127.0.0.1"
    odd = effective_price(tier(storage_class="INTELLIGENT_TIERING"))
    assert odd.catalog is None and "aws/INTELLIGENT_TIERING" in (odd.note or "")


def test_a_tier_may_name_its_catalog_entry() -> None:
    """Azure Blob has no URL scheme of its own: a tier behind a gateway names the entry."""
    quote = effective_price(tier(endpoint_url="http://gateway:9000", catalog="azure/COOL"))
    assert quote.catalog == "azure/COOL" and quote.provider == "azure"
    assert quote.storage_gb_month == 0.01 and quote.min_storage_days == 30
    assert catalog_key(tier(catalog="azure/ARCHIVE")) == "azure/ARCHIVE"


def test_a_price_of_zero_is_taken_at_its_word() -> None:
    """A figure the tiers file sets, 0 included, is the tier's own: no default replaces it."""
    zeros = Price(storage_gb_month=0.0, retrieval_gb=0.0, egress_gb=0.0, min_storage_days=0)
    free = Tier(name="cold", url="s3://b/p", rank=0, storage_class="GLACIER_IR", price=zeros)
    quote = effective_price(free)
    assert quote.storage_gb_month == 0.0 and quote.min_storage_days == 0
    assert quote.retrieval_gb == 0.0 and quote.egress_gb == 0.0
    assert {"storage_gb_month", "retrieval_gb", "egress_gb", "min_storage_days"} <= quote.given


def test_usd_month_is_bytes_over_a_billion_times_the_price() -> None:
    quote = PriceQuote(storage_gb_month=0.023)
    assert quote.usd_month(49 * 10**12) == pytest.approx(1127.0)
    assert quote.usd_month(GB) == 0.023


def test_billable_bytes_round_small_objects_up() -> None:
    quote = effective_price(tier(storage_class="STANDARD_IA"))
    assert quote.billable_bytes(1000, objects=2) == 2 * 131072
    assert quote.billable_bytes(10**9, objects=2) == 10**9


def test_what_if_figures_and_catalog_entries() -> None:
    base = effective_price(tier(storage_class="STANDARD", egress_gb=0.05))
    cheaper = with_figures(base, {"storage_gb_month": 0.01})
    assert cheaper.storage_gb_month == 0.01 and cheaper.given == {"egress_gb", "storage_gb_month"}
    deep = catalog_quote("aws/DEEP_ARCHIVE")
    assert deep.storage_gb_month == 0.00099 and deep.min_storage_days == 180
    assert deep.catalog == "aws/DEEP_ARCHIVE" and deep.given == frozenset()
    assert deep.sources["storage_gb_month"].as_of
    with pytest.raises(KeyError):
        catalog_quote("aws/NOPE")
    with pytest.raises(ValueError, match="unknown price figures"):
        with_figures(base, {"storage": 1.0})


def test_a_catalog_naming_an_unknown_source_is_refused() -> None:
    document = """
sources: {a: {url: "https://example.com/", covers: x, as_of: "2026-01-01"}}
entries:
  p/STANDARD:
    name: x
    storage_gb_month: 1
    retrieval_gb: 0
    egress_gb: 0
    min_storage_days: 0
    min_object_bytes: 0
    write_requests_per_1000: 0
    read_requests_per_1000: 0
    source: b
"""
    with pytest.raises(ValidationError, match="unknown source 'b'"):
        parse_catalog(document)
    with pytest.raises(ValidationError, match="storage_gb_month"):
        parse_catalog(document.replace("storage_gb_month: 1", "storage_gb_month: -1"))
