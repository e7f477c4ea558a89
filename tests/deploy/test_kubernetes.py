"""Kubernetes manifests (deploy/): the base and both overlays rendered by `kubectl kustomize`
(what `kubectl apply -k` sends), every document validated against the API schemas of
pinned Kubernetes versions, and what an operator relies on checked on the result."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import typer.main
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.cli import cli
from app.cost.prices import effective_price
from app.db.migrate import upgrade
from app.main import NO_BACKGROUND, create_app
from app.policy.loading import parse_yaml, validate_policy
from app.settings import Settings, load_settings
from app.tiers_config import load_tiers
from tests.builders import issue_token
from tests.deploy.support import REPO, Doc, is_custom, pod_spec, render, unknown_settings

# The oldest cluster version the manifests support (docs/operations.md) and the newest
# whose schemas kubernetes-validate ships: both are bundled, nothing is downloaded.
KUBERNETES_VERSIONS = ("1.30", "1.37")
KUSTOMIZATIONS = {
    "base": REPO / "deploy/base",
    "dev": REPO / "deploy/overlays/dev",
    "prod": REPO / "deploy/overlays/prod",
}
NAMESPACES = {"dev": "ckpt-dev", "prod": "ckpt"}
# Prometheus Operator kinds: custom resources without a bundled schema, checked below.
MONITORING_KINDS = frozenset({"ServiceMonitor", "PodMonitor", "PrometheusRule"})
PRICE_SERIES = "ckpt:tier_storage_price_usd_per_gb_month"
SENSITIVE = re.compile(r"TOKEN|PASSWORD|SECRET|ACCESS_KEY|DATABASE_URL|CREDENTIALS_JSON")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {name: render(path) for name, path in KUSTOMIZATIONS.items()}


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def containers(docs: list[Doc]) -> Iterator[tuple[str, Doc, Doc]]:
    """(where, workload, container) for every container of every pod template."""
    for doc in docs:
        spec = pod_spec(doc)
        pods = [] if spec is None else spec.get("initContainers", []) + spec["containers"]
        for container in pods:
            yield f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}", doc, container


def main_container(doc: Doc) -> Doc:
    spec = pod_spec(doc)
    assert spec is not None
    containers: list[Doc] = spec["containers"]
    (container,) = containers
    return container


def pod_labels(doc: Doc) -> dict[str, str]:
    labels: dict[str, str] = doc["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and In expressions) against a pod's labels."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def env_value(container: Doc, name: str) -> Doc:
    entries: list[Doc] = [e for e in container.get("env", []) if e["name"] == name]
    (entry,) = entries
    return entry


# --- schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_document_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[Doc]], name: str, version: str
) -> None:
    for doc in rendered[name]:
        where = f"{name}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in MONITORING_KINDS:
            assert is_custom(doc), where  # structure checked by the monitoring tests
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{where} is not valid Kubernetes {version}: {path}: {error.message}")


def test_the_validation_is_strict(rendered: dict[str, list[Doc]]) -> None:
    """A misspelt field (here `resource`) is what an apply would silently drop."""
    broken = copy.deepcopy(find(rendered["prod"], "Deployment", "ckpt-api"))
    main_container(broken)["resource"] = main_container(broken).pop("resources")
    for version in KUBERNETES_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError, match="resource"):
            kubernetes_validate.validate(broken, version, strict=True)


# --- what the overlays deploy -------------------------------------------------------------------


@pytest.mark.parametrize("overlay", sorted(NAMESPACES))
def test_overlays_deploy_every_part_into_their_namespace(
    rendered: dict[str, list[Doc]], overlay: str
) -> None:
    docs = rendered[overlay]
    identities = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(identities) == len(set(identities)), "a resource is defined twice"
    assert {
        ("ServiceAccount", "ckpt"),
        ("Deployment", "ckpt-api"),
        ("Service", "ckpt-api"),
        ("HorizontalPodAutoscaler", "ckpt-api"),
        ("PodDisruptionBudget", "ckpt-api"),
        ("Deployment", "ckpt-scheduler"),
        ("Deployment", "ckpt-worker"),
        ("Job", "ckpt-migrate"),
        ("ConfigMap", "ckpt-env"),
        ("ConfigMap", "ckpt-tiers"),
        ("ConfigMap", "ckpt-policies"),
        ("ConfigMap", "ckpt-grafana-dashboard"),
        ("ServiceMonitor", "ckpt-api"),
        ("PodMonitor", "ckpt-background"),
        ("PrometheusRule", "ckpt-alerts"),
        ("PrometheusRule", "ckpt-tier-prices"),
    } <= set(identities)
    assert {d["metadata"].get("namespace") for d in docs} == {NAMESPACES[overlay]}


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_each_workload_runs_a_real_ckpt_command(rendered: dict[str, list[Doc]], name: str) -> None:
    commands = set(typer.main.get_command(cli).commands)  # type: ignore[attr-defined]
    expected = {
        ("Deployment", "ckpt-api"): "api",
        ("Deployment", "ckpt-scheduler"): "scheduler",
        ("Deployment", "ckpt-worker"): "worker",
        ("Job", "ckpt-migrate"): "migrate",
    }
    for (kind, workload), command in expected.items():
        container = main_container(find(rendered[name], kind, workload))
        args = container["args"]
        assert "command" not in container, workload  # the image's entrypoint: ckpt
        if command in ("worker", "scheduler"):  # their counters, on the port scraped
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env["CKPT_METRICS_PORT"] == str(ports["metrics"]), workload
        assert args[0] == command in commands, (workload, args)
        if name == "prod":
            assert container["image"].startswith("registry.example.com/"), container["image"]


FIRST_PHASE = "app.kubernetes.io/component notin (api,scheduler,worker)"


@pytest.mark.parametrize("overlay", sorted(NAMESPACES))
def test_first_rollout_phase_migrates_before_any_replica_starts(
    rendered: dict[str, list[Doc]], overlay: str
) -> None:
    """docs/operations.md applies what this label selector picks, waits for the migration
    Job, then applies the rest: the first phase must hold the Job and all it mounts, and
    no long-running process."""
    assert f"-l '{FIRST_PHASE}'" in (REPO / "docs/operations.md").read_text()
    key, _, values = FIRST_PHASE.partition(" notin ")
    later = set(values.strip("()").split(","))
    first = {
        (d["kind"], d["metadata"]["name"])
        for d in rendered[overlay]
        if d["metadata"].get("labels", {}).get(key) not in later  # a missing key matches too
    }
    assert ("Job", "ckpt-migrate") in first
    assert not {kind for kind, _ in first} & {"Deployment", "HorizontalPodAutoscaler"}
    job = find(rendered[overlay], "Job", "ckpt-migrate")
    spec = pod_spec(job)
    assert spec is not None
    needed = {("ServiceAccount", spec["serviceAccountName"])}
    needed |= {("ConfigMap", v["configMap"]["name"]) for v in spec["volumes"] if "configMap" in v}
    needed |= {("ConfigMap", name) for name in referenced_config_maps(main_container(job))}
    assert needed <= first, needed - first


def test_prod_keeps_the_api_up_through_load_and_node_drains(
    rendered: dict[str, list[Doc]],
) -> None:
    docs = rendered["prod"]
    api = find(docs, "Deployment", "ckpt-api")
    hpa = find(docs, "HorizontalPodAutoscaler", "ckpt-api")
    pdb = find(docs, "PodDisruptionBudget", "ckpt-api")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "ckpt-api",
    }
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    # The autoscaler owns the count; one written in the Deployment is reset by each apply.
    assert "replicas" not in api["spec"]
    # The budget covers the API pods and only them, and leaves replicas serving.
    labels = {d["metadata"]["name"]: pod_labels(d) for d in docs if d["kind"] == "Deployment"}
    chosen = {name for name, pod in labels.items() if selects(pdb["spec"]["selector"], pod)}
    assert chosen == {"ckpt-api"}
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]
    # Several schedulers are safe (the sweep takes an advisory lock): one can go.
    assert find(docs, "Deployment", "ckpt-scheduler")["spec"]["replicas"] >= 2
    assert find(docs, "Deployment", "ckpt-worker")["spec"]["replicas"] >= 2


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_api_probes_ask_healthz_on_the_port_it_serves(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    docs = rendered[name]
    api = find(docs, "Deployment", "ckpt-api")
    container = main_container(api)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(env_value(container, "CKPT_PORT")["value"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    service = find(docs, "Service", "ckpt-api")
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(api))
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi)?$")
UNITS = {None: 1.0, "m": 1e-3, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30}


def quantity(value: str | int) -> float:
    match = QUANTITY.match(str(value))
    assert match, f"unexpected quantity {value!r}"
    return float(match[1]) * UNITS[match[2]]


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_container_has_requests_within_limits(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    for where, _, container in containers(rendered[name]):
        resources = container.get("resources", {})
        for resource in ("cpu", "memory"):
            request = resources.get("requests", {}).get(resource)
            limit = resources.get("limits", {}).get(resource)
            assert request is not None and limit is not None, f"{where}: {resource}"
            assert quantity(request) <= quantity(limit), f"{where}: {resource}"


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_secrets_are_referenced_never_written_in_the_manifests(
    rendered: dict[str, list[Doc]], name: str
) -> None:
    docs = rendered[name]
    assert not [d for d in docs if d["kind"] == "Secret"], "create Secrets out of band"
    for where, _, container in containers(docs):
        for entry in container.get("env", []):
            if SENSITIVE.search(entry["name"]):
                assert "value" not in entry, f"{where}: {entry['name']} written in clear"
                assert "secretKeyRef" in entry["valueFrom"], f"{where}: {entry['name']}"
        database = env_value(container, "CKPT_DATABASE_URL")  # holds the password
        assert database["valueFrom"]["secretKeyRef"]["name"] == "ckpt-secrets", where
    api = main_container(find(docs, "Deployment", "ckpt-api"))
    assert "secretKeyRef" in env_value(api, "CKPT_BOOTSTRAP_TOKEN")["valueFrom"]
    for config in (d for d in docs if d["kind"] == "ConfigMap"):
        for key, text in config.get("data", {}).items():
            assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", text), f"credentials in {key}"
            assert "password" not in text.lower(), key


def referenced_config_maps(container: Doc) -> list[str]:
    return [e["configMapRef"]["name"] for e in container.get("envFrom", []) if "configMapRef" in e]


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_ckpt_variable_set_is_a_setting(rendered: dict[str, list[Doc]], name: str) -> None:
    docs = rendered[name]
    names: set[str] = set()
    for where, _, container in containers(docs):
        names |= {e["name"] for e in container.get("env", [])}
        for config in referenced_config_maps(container):
            names |= set(find(docs, "ConfigMap", config)["data"])  # must exist too
        assert referenced_config_maps(container) == ["ckpt-env"], where
    assert unknown_settings(names) == []
    assert {"CKPT_DATABASE_URL", "CKPT_TIERS_FILE", "CKPT_POLICIES_DIR", "CKPT_AUTH"} <= names


def mounted_config(doc: Doc, container: Doc, path: Path) -> tuple[str, str | None]:
    """(ConfigMap name, key) that a container reads at `path` (a file or a directory)."""
    spec = pod_spec(doc)
    assert spec is not None
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        mounted = Path(mount["mountPath"])
        if mounted in (path, path.parent):
            config = volumes[mount["name"]]["configMap"]["name"]
            return config, (path.name if mounted == path.parent else None)
    raise AssertionError(f"nothing mounted at {path}")


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_mounted_tiers_and_policies_load_as_the_service_loads_them(
    rendered: dict[str, list[Doc]], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = rendered[name]
    env = find(docs, "ConfigMap", "ckpt-env")["data"]
    tiers_file, policies_dir = Path(env["CKPT_TIERS_FILE"]), Path(env["CKPT_POLICIES_DIR"])
    for where, doc, container in containers(docs):
        assert mounted_config(doc, container, tiers_file) == ("ckpt-tiers", tiers_file.name), where
        assert mounted_config(doc, container, policies_dir) == ("ckpt-policies", None), where

    # The ConfigMaps as the pods see them, read by the service's own loaders.
    (tmp_path / "policies").mkdir()
    tiers_text = find(docs, "ConfigMap", "ckpt-tiers")["data"][tiers_file.name]
    (tmp_path / "tiers.yaml").write_text(tiers_text)
    policies = find(docs, "ConfigMap", "ckpt-policies")["data"]
    for key, text in policies.items():
        (tmp_path / "policies" / key).write_text(text)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("CKPT_TIERS_FILE", str(tmp_path / "tiers.yaml"))
    monkeypatch.setenv("CKPT_POLICIES_DIR", str(tmp_path / "policies"))
    api = main_container(find(docs, "Deployment", "ckpt-api"))
    monkeypatch.setenv("CKPT_HOST", env_value(api, "CKPT_HOST")["value"])
    settings = load_settings()  # durations and the auth/host rule, as at start-up
    assert settings.auth == "on"

    tiers = load_tiers(settings)
    # Every replica must see the same bytes: no tier on a pod's own filesystem.
    assert {t.url.split(":", 1)[0] for t in tiers} <= {"s3", "gs"}, [t.url for t in tiers]
    names = [t.name for t in tiers]
    assert policies
    for key, text in policies.items():
        assert validate_policy(parse_yaml(text, field=key), names).rules, key


def test_base_ships_the_repository_policies(rendered: dict[str, list[Doc]]) -> None:
    """The seed policies are a copy (kustomize reads no file outside its folder)."""
    shipped = find(rendered["base"], "ConfigMap", "ckpt-policies")["data"]
    assert shipped == {p.name: p.read_text() for p in sorted((REPO / "policies").glob("*.yaml"))}


# --- monitoring ------------------------------------------------------------------------------


def sample_names(text: str) -> set[str]:
    """Every series name a Prometheus scrape of `text` can hold, from each family's type."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


@pytest.fixture(scope="module")
def app_series(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """What a real API process's /metrics exposes: its own counters (the same families a
    worker's or scheduler's exporter serves) and the catalog gauges."""
    root = tmp_path_factory.mktemp("metrics-app")
    url = f"sqlite:///{root / 'ckpt.db'}"
    upgrade(url)
    settings = Settings(
        database_url=url, data_dir=root / "data", policies_dir=root / "none", auth="off"
    )
    with TestClient(create_app(settings, roles=NO_BACKGROUND)) as client:
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return sample_names(response.text)


def rules(docs: list[Doc]) -> list[Doc]:
    return [
        rule
        for doc in docs
        if doc["kind"] == "PrometheusRule"
        for group in doc["spec"]["groups"]
        for rule in group["rules"]
    ]


GRAFANA_VARIABLES = re.compile(r"\$\{?(\w+)\}?")


def metric_names(expr: str) -> set[str]:
    """The series a PromQL expression reads, from its syntax tree (Grafana's variables
    replaced by sample values first: `$__rate_interval` is a duration, others label regexes)."""
    concrete = GRAFANA_VARIABLES.sub(lambda m: "5m" if m[1].startswith("__") else ".*", expr)
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(concrete), visit)
    return names


def dashboard(docs: list[Doc]) -> Doc:
    config = find(docs, "ConfigMap", "ckpt-grafana-dashboard")
    assert config["metadata"]["labels"] == {"grafana_dashboard": "1"}  # the sidecar's label
    (text,) = config["data"].values()
    board: Doc = json.loads(text)
    return board


@pytest.mark.parametrize("overlay", sorted(NAMESPACES))
def test_dashboard_queries_read_series_the_service_exposes(
    rendered: dict[str, list[Doc]], overlay: str, app_series: set[str]
) -> None:
    docs = rendered[overlay]
    board = dashboard(docs)
    assert board["uid"] and board["title"]
    panels = [p for p in board["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    recorded = {rule["record"] for rule in rules(docs) if "record" in rule}
    used: set[str] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names <= app_series | recorded, (panel["title"], names - app_series)
            used |= names
    (namespace,) = [v for v in board["templating"]["list"] if v["name"] == "namespace"]
    query = re.fullmatch(r"label_values\((\w+), namespace\)", namespace["definition"])
    assert query and query[1] in used, namespace["definition"]
    # What the dashboard is for: actions, bytes moved and deleted, lag, cost per tier.
    assert {
        "ckpt_actions",
        "ckpt_actions_finished_total",
        "ckpt_transfer_bytes_total",
        "ckpt_purged_bytes_total",
        "ckpt_action_claim_lag_seconds_bucket",
        "ckpt_tier_bytes",
        PRICE_SERIES,
    } <= used


@pytest.mark.parametrize("overlay", sorted(NAMESPACES))
def test_alerts_read_series_the_service_exposes(
    rendered: dict[str, list[Doc]], overlay: str, app_series: set[str]
) -> None:
    alerts = [rule for rule in rules(rendered[overlay]) if "alert" in rule]
    for alert in alerts:
        names = metric_names(alert["expr"])
        assert names <= app_series | {"up"}, (alert["alert"], names - app_series)
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert alert["annotations"]["summary"], alert["alert"]
    used = set().union(*(metric_names(a["expr"]) for a in alerts))
    # the signals that matter: lag, stalled and failed actions, drift, a failing provider
    assert {
        "ckpt_action_claim_lag_seconds_bucket",
        "ckpt_actions",
        "ckpt_actions_finished_total",
        "ckpt_checkpoints_drifting",
        "ckpt_storage_retries_total",
    } <= used


@pytest.mark.parametrize("overlay", sorted(NAMESPACES))
def test_tier_prices_for_the_cost_panels_match_the_tiers(
    rendered: dict[str, list[Doc]], overlay: str, tmp_path: Path
) -> None:
    docs = rendered[overlay]
    tiers_file = tmp_path / "tiers.yaml"
    tiers_file.write_text(find(docs, "ConfigMap", "ckpt-tiers")["data"]["tiers.yaml"])
    tiers = load_tiers(Settings(tiers_file=tiers_file, data_dir=tmp_path))
    expected = {t.name: effective_price(t).storage_gb_month for t in tiers}

    prices: dict[str, float] = {}
    for rule in rules(docs):
        if rule.get("record") == PRICE_SERIES:
            value = re.fullmatch(r"vector\(([0-9.eE+-]+)\)", rule["expr"])
            assert value, rule["expr"]
            assert rule["labels"]["namespace"] == NAMESPACES[overlay], rule["labels"]
            prices[rule["labels"]["tier"]] = float(value[1])
    assert prices == expected


@pytest.mark.parametrize("overlay", sorted(NAMESPACES))
def test_service_monitor_scrapes_the_api_with_a_token_from_a_secret(
    rendered: dict[str, list[Doc]], overlay: str
) -> None:
    docs = rendered[overlay]
    monitor = find(docs, "ServiceMonitor", "ckpt-api")
    service = find(docs, "Service", "ckpt-api")
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "ckpt-metrics-token", "key": "token"},
    }
    assert not {"bearerTokenFile", "bearerTokenSecret", "basicAuth"} & set(endpoint)


@pytest.mark.parametrize("overlay", sorted(NAMESPACES))
def test_pod_monitor_scrapes_every_worker_and_scheduler(
    rendered: dict[str, list[Doc]], overlay: str
) -> None:
    docs = rendered[overlay]
    monitor = find(docs, "PodMonitor", "ckpt-background")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    scraped = {
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Deployment" and selects(monitor["spec"]["selector"], pod_labels(d))
    }
    assert scraped == {"ckpt-scheduler", "ckpt-worker"}
    for name in scraped:
        container = main_container(find(docs, "Deployment", name))
        assert endpoint["port"] in {p["name"] for p in container["ports"]}, name
    assert endpoint["path"] == "/metrics"


def test_metrics_take_a_read_token_and_refuse_none(tmp_path: Path) -> None:
    """Why the ServiceMonitor carries a token, and which: `read` on every project (the
    command docs/operations.md gives), since the metrics cover them all."""
    url = f"sqlite:///{tmp_path / 'ckpt.db'}"
    upgrade(url)
    settings = Settings(
        database_url=url, data_dir=tmp_path / "data", policies_dir=tmp_path / "none", auth="on"
    )
    app = create_app(settings, roles=NO_BACKGROUND)
    with TestClient(app) as client:
        _, secret = issue_token(app, name="prometheus", scopes=("read",), projects=("*",))
        _, bounded = issue_token(app, name="one-project", scopes=("read",), projects=("llama",))
        assert client.get("/metrics").status_code == 401
        refused = client.get("/metrics", headers={"Authorization": f"Bearer {bounded}"})
        assert refused.status_code == 403
        scraped = client.get("/metrics", headers={"Authorization": f"Bearer {secret}"})
    assert scraped.status_code == 200
    assert "ckpt_tier_bytes" in sample_names(scraped.text)
    assert "--scope read --project '*'" in (REPO / "docs/operations.md").read_text()


def test_dev_overlay_changes_only_what_it_says(rendered: dict[str, list[Doc]]) -> None:
    """The overlays really patch the base: a renderer that ignored them would pass the rest."""
    base, dev, prod = rendered["base"], rendered["dev"], rendered["prod"]
    assert find(dev, "HorizontalPodAutoscaler", "ckpt-api")["spec"]["minReplicas"] == 1
    assert find(dev, "Deployment", "ckpt-worker")["spec"]["replicas"] == 1
    assert find(dev, "ConfigMap", "ckpt-env")["data"]["CKPT_SWEEP_INTERVAL"] == "1m"
    assert (
        find(dev, "ConfigMap", "ckpt-env")["data"]["CKPT_AUTH"]
        == find(base, "ConfigMap", "ckpt-env")["data"]["CKPT_AUTH"]
        == "on"
    )
    for workload in ("ckpt-api", "ckpt-scheduler", "ckpt-worker"):
        container = main_container(find(prod, "Deployment", workload))
        assert env_value(container, "GOOGLE_APPLICATION_CREDENTIALS")
        assert "CKPT_DATABASE_URL" in {e["name"] for e in container["env"]}  # merged, not replaced
    assert yaml.safe_load(find(prod, "ConfigMap", "ckpt-tiers")["data"]["tiers.yaml"]) != (
        yaml.safe_load(find(base, "ConfigMap", "ckpt-tiers")["data"]["tiers.yaml"])
    )
