from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.domain.errors import Invalid
from app.domain.tier import Price, Tier, locate
from app.settings import Settings
from app.tiers_config import TiersFileError, load_tiers, parse_tiers_file


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings() below must not pick up a CKPT_TIERS_FILE from the surrounding shell."""
    for name in list(os.environ):
        if name.upper().startswith("CKPT_"):
            monkeypatch.delenv(name)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path.resolve()


def write_tiers(directory: Path, text: str) -> Path:
    path = directory / "tiers.yaml"
    path.write_text(text)
    return path


# --- default tiers -------------------------------------------------------------------------


def test_default_tiers_under_data_dir(root: Path) -> None:
    data_dir = root / "data"
    tiers = load_tiers(Settings(data_dir=data_dir))
    assert [(t.name, t.rank) for t in tiers] == [
        ("hot", 0),
        ("warm", 1),
        ("cold", 2),
        ("archive", 3),
    ]
    for tier in tiers:
        assert tier.url == f"file://{data_dir / tier.name}"
        assert tier.is_local
        assert (data_dir / tier.name).is_dir()
        assert tier.price == Price()
        assert tier.storage_class is None
        assert tier.endpoint_url is None


def test_default_tiers_from_relative_data_dir_are_absolute(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(root)
    tiers = load_tiers(Settings())  # CKPT_DATA_DIR default ./var/data
    assert tiers[0].url == f"file://{root / 'var' / 'data' / 'hot'}"
    assert (root / "var" / "data" / "archive").is_dir()


def test_data_dir_from_environment(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_DATA_DIR", str(root / "elsewhere"))
    tiers = load_tiers(Settings())
    assert tiers[1].url == f"file://{root / 'elsewhere' / 'warm'}"
    assert (root / "elsewhere" / "warm").is_dir()


# --- tiers file ----------------------------------------------------------------------------


def test_tiers_file_parses_in_order(root: Path) -> None:
    path = write_tiers(
        root,
        f"""\
tiers:
  - name: hot
    url: file://{root}/nvme/ckpt/
  - name: warm
    url: gs://ckpt-warm/prod
    storage_class: NEARLINE
  - name: cold
    url: s3://ckpt-cold/prod
    storage_class: GLACIER_IR
    endpoint_url: http://127.0.0.1:9000
    price: {{storage_gb_month: 0.004, retrieval_gb: 0.03, egress_gb: 0.09, min_storage_days: 90}}
  - name: archive
    url: s3://ckpt-archive
""",
    )
    tiers = load_tiers(Settings(tiers_file=path))
    assert tiers == parse_tiers_file(path)
    assert [(t.name, t.rank) for t in tiers] == [
        ("hot", 0),
        ("warm", 1),
        ("cold", 2),
        ("archive", 3),
    ]
    hot, warm, cold, archive = tiers
    assert hot == Tier(name="hot", url=f"file://{root}/nvme/ckpt", rank=0)
    assert hot.is_local
    assert (root / "nvme" / "ckpt").is_dir()
    assert warm == Tier(name="warm", url="gs://ckpt-warm/prod", rank=1, storage_class="NEARLINE")
    assert cold == Tier(
        name="cold",
        url="s3://ckpt-cold/prod",
        rank=2,
        storage_class="GLACIER_IR",
        endpoint_url="http://127.0.0.1:9000",
        request_checksums="when_required",  # an S3-compatible endpoint: only when required
        price=Price(storage_gb_month=0.004, retrieval_gb=0.03, egress_gb=0.09, min_storage_days=90),
    )
    assert archive.url == "s3://ckpt-archive"
    assert not (cold.is_local or warm.is_local or archive.is_local)


def test_tiers_file_takes_precedence_over_data_dir(root: Path) -> None:
    path = write_tiers(root, f"tiers:\n  - {{name: fast, url: 'file://{root}/fast'}}\n")
    tiers = load_tiers(Settings(tiers_file=path, data_dir=root / "data"))
    assert [t.name for t in tiers] == ["fast"]
    assert not (root / "data").exists()


def test_tiers_file_from_environment(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tiers(root, "tiers:\n  - {name: only, url: 's3://bucket/p'}\n")
    monkeypatch.setenv("CKPT_TIERS_FILE", str(path))
    assert [t.url for t in load_tiers(Settings())] == ["s3://bucket/p"]


def test_upper_case_scheme_is_a_local_tier(root: Path) -> None:
    path = write_tiers(root, f"tiers:\n  - {{name: hot, url: 'FILE://{root}/loud'}}\n")
    [tier] = load_tiers(Settings(tiers_file=path))
    assert tier.url == f"file://{root}/loud"
    assert tier.is_local
    assert (root / "loud").is_dir()


BAD_TIERS = {
    "unknown field": (
        "tiers:\n  - {name: hot, url: 's3://b/p', colour: red}\n",
        ["tiers[0].colour", "Extra inputs"],
    ),
    "unknown top-level field": (
        "tiers:\n  - {name: hot, url: 's3://b/p'}\ndefaults: {}\n",
        ["defaults"],
    ),
    "unknown price field": (
        "tiers:\n  - {name: hot, url: 's3://b/p', price: {storage_gb: 1}}\n",
        ["tiers[0].price.storage_gb"],
    ),
    "bad scheme": (
        "tiers:\n  - {name: hot, url: 's3://b/p'}\n  - {name: web, url: 'https://x/y'}\n",
        ["tiers[1].url", "unsupported scheme 'https'"],
    ),
    "relative file url": (
        "tiers:\n  - {name: hot, url: 'file://relative/dir'}\n",
        ["tiers[0].url"],
    ),
    "dot-dot in url": (
        "tiers:\n  - {name: hot, url: 'file:///srv/ckpt/../etc'}\n",
        ["tiers[0].url", "'..'"],
    ),
    "bucket missing": (
        "tiers:\n  - {name: hot, url: 's3:///prefix'}\n",
        ["tiers[0].url", "names no bucket"],
    ),
    "missing url": (
        "tiers:\n  - {name: hot, url: 's3://b/p'}\n  - {name: cold}\n",
        ["tiers[1].url", "Field required"],
    ),
    "missing name": (
        "tiers:\n  - {url: 's3://b/p'}\n",
        ["tiers[0].name", "Field required"],
    ),
    "bad name": (
        "tiers:\n  - {name: Hot Tier, url: 's3://b/p'}\n",
        ["tiers[0].name"],
    ),
    "duplicate names": (
        "tiers:\n  - {name: hot, url: 's3://b/p'}\n  - {name: hot, url: 's3://b/q'}\n",
        ["tiers", "'hot' appears twice"],
    ),
    "negative price": (
        "tiers:\n  - {name: hot, url: 's3://b/p', price: {egress_gb: -0.01}}\n",
        ["tiers[0].price.egress_gb", "greater than or equal to 0"],
    ),
    "infinite price": (
        "tiers:\n  - {name: hot, url: 's3://b/p', price: {storage_gb_month: .inf}}\n",
        ["tiers[0].price.storage_gb_month", "finite"],
    ),
    "negative min_storage_days": (
        "tiers:\n  - {name: hot, url: 's3://b/p', price: {min_storage_days: -1}}\n",
        ["tiers[0].price.min_storage_days"],
    ),
    "price not a number": (
        "tiers:\n  - {name: hot, url: 's3://b/p', price: {retrieval_gb: cheap}}\n",
        ["tiers[0].price.retrieval_gb"],
    ),
    "endpoint not a url": (
        "tiers:\n  - {name: hot, url: 's3://b/p', endpoint_url: 'minio:9000'}\n",
        ["tiers[0].endpoint_url", "http"],
    ),
    "empty tier list": ("tiers: []\n", ["tiers", "at least 1"]),
    "no tiers key": ("{}\n", ["tiers", "Field required"]),
    "a list at top level": ("- {name: hot, url: 's3://b/p'}\n", ["mapping", "tiers"]),
    "empty file": ("", ["mapping", "tiers"]),
    "bad YAML": ("tiers:\n  - name: hot\n    url: [s3://b/p\n", ["not valid YAML"]),
    "tab indentation": ("tiers:\n\t- name: hot\n", ["not valid YAML"]),
}


@pytest.mark.parametrize(("text", "fragments"), BAD_TIERS.values(), ids=BAD_TIERS.keys())
def test_invalid_tiers_file_names_file_and_field(
    root: Path, text: str, fragments: list[str]
) -> None:
    path = write_tiers(root, text)
    with pytest.raises(TiersFileError) as caught:
        load_tiers(Settings(tiers_file=path))
    message = str(caught.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_missing_tiers_file(root: Path) -> None:
    path = root / "nowhere" / "tiers.yaml"
    with pytest.raises(TiersFileError) as caught:
        load_tiers(Settings(tiers_file=path))
    assert str(path) in str(caught.value)
    assert "cannot be read" in str(caught.value)


def test_tiers_file_that_is_a_directory(root: Path) -> None:
    with pytest.raises(TiersFileError, match="cannot be read") as caught:
        parse_tiers_file(root)
    assert str(root) in str(caught.value)


def test_invalid_tiers_file_creates_no_directory(root: Path) -> None:
    path = write_tiers(
        root,
        f"tiers:\n  - {{name: hot, url: 'file://{root}/made'}}\n  - {{name: hot, url: 's3://b'}}\n",
    )
    with pytest.raises(TiersFileError):
        load_tiers(Settings(tiers_file=path))
    assert not (root / "made").exists()


# --- locate --------------------------------------------------------------------------------


@pytest.fixture
def tiers(root: Path) -> list[Tier]:
    return [
        Tier(name="hot", url=f"file://{root}/a/hot", rank=0),
        Tier(name="hot-inner", url=f"file://{root}/a/hot/inner", rank=1),
        Tier(name="cold", url="s3://ckpt-cold/prod", rank=2),
        Tier(name="cold-deep", url="s3://ckpt-cold/prod/deep", rank=3),
        Tier(name="archive", url="gs://ckpt-archive", rank=4),
    ]


def refused(uri: str, tiers: list[Tier]) -> str:
    with pytest.raises(Invalid) as caught:
        locate(uri, tiers, field_name="uri")
    assert caught.value.field == "uri"
    return caught.value.message


def test_locate_local(root: Path, tiers: list[Tier]) -> None:
    located = locate(f"file://{root}/a/hot/proj/run/step-100", tiers)
    assert located.tier.name == "hot"
    assert located.key == "proj/run/step-100"
    assert located.uri == f"file://{root}/a/hot/proj/run/step-100"


def test_locate_normalises_slashes_and_localhost(root: Path, tiers: list[Tier]) -> None:
    located = locate(f"file://localhost{root}/a/hot//proj/./run/", tiers)
    assert located.tier.name == "hot"
    assert located.key == "proj/run"
    assert located.uri == f"file://{root}/a/hot/proj/run"


def test_locate_picks_longest_prefix(root: Path, tiers: list[Tier]) -> None:
    assert locate(f"file://{root}/a/hot/inner/x", tiers).tier.name == "hot-inner"
    assert locate(f"file://{root}/a/hot/inner/x", tiers).key == "x"
    assert locate(f"file://{root}/a/hot/innerx/y", tiers).tier.name == "hot"
    assert locate("s3://ckpt-cold/prod/deep/k", tiers).tier.name == "cold-deep"
    assert locate("s3://ckpt-cold/prod/deeper/k", tiers).tier.name == "cold"
    # the order of the tier list does not matter
    assert locate(f"file://{root}/a/hot/inner/x", list(reversed(tiers))).tier.name == "hot-inner"
    assert locate("s3://ckpt-cold/prod/deep/k", list(reversed(tiers))).tier.name == "cold-deep"


@pytest.mark.parametrize(
    ("uri", "tier", "key"),
    [
        ("s3://ckpt-cold/prod/proj/run/step-1", "cold", "proj/run/step-1"),
        ("s3://ckpt-cold/prod/proj/run/step-1/", "cold", "proj/run/step-1"),
        ("S3://ckpt-cold/prod/x", "cold", "x"),
        ("gs://ckpt-archive/proj/run/final", "archive", "proj/run/final"),
    ],
)
def test_locate_object_store(tiers: list[Tier], uri: str, tier: str, key: str) -> None:
    located = locate(uri, tiers)
    assert located.tier.name == tier
    assert located.key == key
    assert located.uri == f"{located.tier.url}/{key}"


@pytest.mark.parametrize(
    "uri",
    [
        "file://{root}/a/hot/../hotter/x",
        "file://{root}/a/hot/proj/../../hotter/x",
        "file://{root}/a/hot/%2e%2e/hotter/x",
        "s3://ckpt-cold/prod/../secret",
    ],
)
def test_locate_refuses_dot_dot(root: Path, tiers: list[Tier], uri: str) -> None:
    assert "'..'" in refused(uri.format(root=root), tiers)


@pytest.mark.parametrize(
    "uri", ["http://example.com/x", "ftp://host/x", "/plain/path", "hdfs://nn/ckpt/x", ""]
)
def test_locate_refuses_unknown_schemes(tiers: list[Tier], uri: str) -> None:
    refused(uri, tiers)


@pytest.mark.parametrize(
    "uri",
    [
        "file://{root}/elsewhere/x",
        "s3://other-bucket/prod/x",
        "s3://ckpt-cold/staging/x",
        "gs://ckpt-cold/prod/x",
        "s3://ckpt-archive/x",
    ],
)
def test_locate_refuses_uri_under_no_tier(root: Path, tiers: list[Tier], uri: str) -> None:
    assert "under no configured tier" in refused(uri.format(root=root), tiers)


@pytest.mark.parametrize(
    "uri",
    [
        "file://{root}/a/hot",
        "file://{root}/a/hot/",
        "file://{root}/a/hot/.",
        "file://{root}/a/hot/inner",
        "s3://ckpt-cold/prod",
        "s3://ckpt-cold/prod/",
        "gs://ckpt-archive",
        "gs://ckpt-archive/",
    ],
)
def test_locate_refuses_tier_root(root: Path, tiers: list[Tier], uri: str) -> None:
    assert "is the root of tier" in refused(uri.format(root=root), tiers)


def test_locate_does_not_confuse_prefix_siblings(root: Path) -> None:
    tiers = [
        Tier(name="hot", url=f"file://{root}/a/hot", rank=0),
        Tier(name="cold", url="s3://bucket/cold", rank=1),
    ]
    assert "under no configured tier" in refused(f"file://{root}/a/hotter/x", tiers)
    assert "under no configured tier" in refused(f"file://{root}/a/hot-x/y", tiers)
    assert "under no configured tier" in refused("s3://bucket/colder/x", tiers)


def test_locate_refuses_symlink_escape(root: Path) -> None:
    (root / "a" / "hot" / "proj").mkdir(parents=True)
    (root / "outside" / "step-1").mkdir(parents=True)
    (root / "a" / "hot" / "proj" / "escape").symlink_to(root / "outside")
    tiers = [Tier(name="hot", url=f"file://{root}/a/hot", rank=0)]
    message = refused(f"file://{root}/a/hot/proj/escape/step-1", tiers)
    assert "symlink" in message
    assert "hot" in message


def test_locate_refuses_symlink_into_another_tier(root: Path) -> None:
    (root / "a" / "hot").mkdir(parents=True)
    (root / "a" / "cold" / "x").mkdir(parents=True)
    (root / "a" / "hot" / "sneaky").symlink_to(root / "a" / "cold")
    tiers = [
        Tier(name="hot", url=f"file://{root}/a/hot", rank=0),
        Tier(name="cold", url=f"file://{root}/a/cold", rank=1),
    ]
    assert "symlink" in refused(f"file://{root}/a/hot/sneaky/x", tiers)


def test_locate_accepts_symlink_inside_its_tier(root: Path) -> None:
    (root / "a" / "hot" / "real" / "step-1").mkdir(parents=True)
    (root / "a" / "hot" / "alias").symlink_to(root / "a" / "hot" / "real")
    tiers = [Tier(name="hot", url=f"file://{root}/a/hot", rank=0)]
    located = locate(f"file://{root}/a/hot/alias/step-1", tiers)
    assert located.key == "alias/step-1"


def test_locate_accepts_tier_root_reached_through_a_symlink(root: Path) -> None:
    (root / "disk" / "ckpt" / "step-1").mkdir(parents=True)
    (root / "mnt").symlink_to(root / "disk")
    tiers = [Tier(name="hot", url=f"file://{root}/mnt/ckpt", rank=0)]
    assert locate(f"file://{root}/mnt/ckpt/step-1", tiers).key == "step-1"


def test_locate_against_loaded_tiers_file(root: Path) -> None:
    path = write_tiers(
        root,
        f"tiers:\n  - {{name: hot, url: 'file://{root}/t/hot/'}}\n"
        "  - {name: cold, url: 's3://bucket/cold/'}\n",
    )
    tiers = load_tiers(Settings(tiers_file=path))
    assert locate(f"file://{root}/t/hot/r/s", tiers).key == "r/s"
    assert locate("s3://bucket/cold/r/s", tiers).tier.name == "cold"
    assert "under no configured tier" in refused(f"file://{root}/t/hotter/r", tiers)


def test_two_tiers_on_one_url_are_refused(tmp_path: Path) -> None:
    """A move between two tiers on one place would delete its own destination."""
    path = tmp_path / "tiers.yaml"
    path.write_text(
        "tiers:\n"
        "  - {name: hot, url: 'file:///srv/ckpt'}\n"
        "  - {name: cold, url: 'file:///srv/ckpt/'}\n"
    )
    with pytest.raises(TiersFileError, match="share url"):
        parse_tiers_file(path)


@pytest.mark.parametrize(
    ("tier", "field"),
    [
        (
            "{name: hot, url: 's3://b/p', endpoint_url: 'http://AKIDEXAMPLE:wJalrXUtnFEMI@m:9000'}",
            "endpoint_url",
        ),
        ("{name: hot, url: 's3://AKIDEXAMPLE:wJalrXUtnFEMI@bucket/p'}", "url"),
        ("{name: hot, url: 'gs://AKIDEXAMPLE:wJalrXUtnFEMI@bucket/p'}", "url"),
    ],
)
def test_credentials_in_a_tier_url_are_refused_without_repeating_them(
    root: Path, tier: str, field: str
) -> None:
    path = write_tiers(root, f"tiers:\n  - {tier}\n")
    with pytest.raises(TiersFileError) as caught:
        load_tiers(Settings(tiers_file=path))
    message = str(caught.value)
    assert f"tiers[0].{field}" in message and "credentials" in message
    assert "wJalrXUtnFEMI" not in message and "AKIDEXAMPLE" not in message
