"""`ckpt policies list|show|shadow|put|delete` (the service's `/v1/policies`), and `validate` and
`schema`, which need no service: a policy file is checked on the machine it is written on,
before anyone stores it. `ckpt policy` is the same group under its older name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from app.cli.output import Column, emit_json, human_bytes, moment_text, print_table, usd_text
from app.cli.remote import Remote, connected, segment, usage
from app.domain.errors import AppError
from app.policy.loading import parse_yaml, validate_policy
from app.policy.schema import policy_json_schema
from app.settings import SettingsError, load_settings
from app.tiers_config import DEFAULT_TIER_NAMES, TiersFileError, parse_tiers_file

policies_cli = typer.Typer(
    help="Retention policies: list, show, put, delete; validate files, print the schema.",
    no_args_is_help=True,
)
POLICY_COLUMNS = (
    Column("name", role="id"),
    Column("mode"),
    Column("rules", justify="right"),
    Column("source", role="text", drop=2),
    Column("updated", drop=3),
    Column("by", drop=1),
)
JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable")]


def local_tier_names() -> list[str]:
    """The tiers a policy file is checked against: CKPT_TIERS_FILE's, else the default
    ones. Read without creating any directory (loading the service's tiers would)."""
    try:
        settings = load_settings()
        if settings.tiers_file is None:
            return list(DEFAULT_TIER_NAMES)
        return [t.name for t in parse_tiers_file(settings.tiers_file)]
    except (SettingsError, TiersFileError) as error:
        raise usage(f"configuration error: {error}") from None


def read_policy_file(path: Path) -> dict[str, Any]:
    try:
        document = parse_yaml(path.read_text(), field=str(path))
    except OSError as error:
        raise usage(f"{path}: {error.strerror or error}") from None
    except AppError as error:
        raise usage(f"{path}: {error.message}") from None
    if not isinstance(document, dict):
        raise usage(f"{path}: a policy must be a mapping with name and rules")
    return document


@policies_cli.command("list")
@connected
def list_(remote: Remote, as_json: JsonOption = False) -> None:
    """The stored policies (GET /v1/policies)."""
    rows = remote.items("/v1/policies")
    if as_json:
        emit_json(rows)
        return
    print_table(
        f"{len(rows)} policies",
        POLICY_COLUMNS,
        [
            (
                r["name"],
                r.get("mode", "enforce"),
                str(len(r["policy"].get("rules", []))),
                r["source"],
                moment_text(r["updated_at"]),
                r["updated_by"] or "",
            )
            for r in rows
        ],
    )


@policies_cli.command("shadow")
@connected
def shadow(
    remote: Remote,
    name: Annotated[str, typer.Argument(help="the policy's name")],
    since: Annotated[str | None, typer.Option(help="ISO 8601; default: all its history")] = None,
    as_json: JsonOption = False,
) -> None:
    """What a policy in `mode: shadow` would have done, how that differs from the policy in
    force, and its regrets (GET /v1/policies/NAME/shadow)."""
    params = {"since": since} if since is not None else None
    body = remote.call("GET", f"/v1/policies/{segment(name)}/shadow", params=params)
    if as_json:
        emit_json(body)
        return
    render_shadow(body)


def render_shadow(body: dict[str, Any]) -> None:
    divergence = body["divergence"]
    typer.echo(
        f"{body['policy']} ({body['mode']}): {len(body['actions'])} would-be action(s); "
        f"it would free {human_bytes(divergence['bytes_freed'])} still stored, "
        f"{usd_text(divergence['usd_month'])}/month; "
        f"{len(divergence['only_shadow'])} only it would take, "
        f"{len(divergence['only_enforced'])} only the policy in force took"
    )
    print_table(
        "would-be actions",
        (
            Column("when"),
            Column("checkpoint", role="id"),
            Column("step", justify="right"),
            Column("action"),
            Column("rule", role="text", drop=1),
            Column("bytes", justify="right", drop=2),
        ),
        [
            (
                moment_text(a["created_at"]),
                a["checkpoint_id"],
                str(a["step"]),
                a["kind"] if a["to_tier"] is None else f"{a['kind']} to {a['to_tier']}",
                a["rule"],
                human_bytes(a["bytes"]),
            )
            for a in body["actions"]
        ],
    )
    regrets = body["regrets"]
    if not regrets:
        typer.echo("regrets: none")
        return
    print_table(
        f"regrets: {len(regrets)}",
        (
            Column("checkpoint", role="id"),
            Column("step", justify="right"),
            Column("would", drop=1),
            Column("on"),
            Column("used"),
            Column("how"),
        ),
        [
            (
                r["checkpoint_id"],
                str(r["step"]),
                r["action"] if r["to_tier"] is None else f"move to {r['to_tier']}",
                moment_text(r["would_delete_at"]),
                moment_text(r["used_at"]),
                r["use"],
            )
            for r in regrets
        ],
    )


@policies_cli.command("show")
@connected
def show(
    remote: Remote,
    name: Annotated[str, typer.Argument(help="the policy's name")],
    as_json: JsonOption = False,
) -> None:
    """One policy as YAML, ready to edit and `put` back (`--json`: as the API answers)."""
    row = remote.call("GET", f"/v1/policies/{segment(name)}")
    if as_json:
        emit_json(row)
        return
    typer.echo(f"# source: {row['source']}; updated {row['updated_at']} by {row['updated_by']}")
    typer.echo(yaml.safe_dump(row["policy"], sort_keys=False).rstrip())


@policies_cli.command("put")
@connected
def put(
    remote: Remote,
    file: Annotated[Path, typer.Argument(help="a policy YAML file; its `name` is the key")],
    as_json: JsonOption = False,
) -> None:
    """Store a policy (PUT /v1/policies/{name}, admin): validated by the service against
    its own tiers, replacing any policy of that name."""
    document = read_policy_file(file)
    name = document.get("name")
    if not isinstance(name, str) or not name:
        raise usage(f"{file}: name: a policy needs a name")
    row = remote.call("PUT", f"/v1/policies/{segment(name)}", json=document)
    if as_json:
        emit_json(row)
        return
    typer.echo(f"policy {row['name']} stored ({len(row['policy'].get('rules', []))} rules)")


@policies_cli.command("delete")
@connected
def delete(
    remote: Remote,
    name: Annotated[str, typer.Argument(help="the policy's name")],
    as_json: JsonOption = False,
) -> None:
    """Delete a stored policy (DELETE /v1/policies/{name}, admin)."""
    remote.call("DELETE", f"/v1/policies/{segment(name)}")
    if as_json:
        emit_json({"name": name, "deleted": True})
        return
    typer.echo(f"policy {name} deleted")


@policies_cli.command("schema")
def schema() -> None:
    """Print the JSON Schema of policy files (no service needed)."""
    typer.echo(json.dumps(policy_json_schema(), indent=2))


@policies_cli.command("validate")
def validate(files: list[Path], as_json: JsonOption = False) -> None:
    """Validate policy files here, against the default tiers or CKPT_TIERS_FILE's (no
    service needed; `put` has the service validate against its own). Exit 1 if any is
    invalid."""
    tiers = local_tier_names()
    verdicts: list[dict[str, Any]] = []
    for path in files:
        try:
            policy = validate_policy(parse_yaml(path.read_text(), field=str(path)), tiers)
            verdict = {"file": str(path), "ok": True, "name": policy.name,
                       "rules": len(policy.rules)}  # fmt: skip
        except AppError as error:
            verdict = {"file": str(path), "ok": False, "field": error.field,
                       "error": error.message}  # fmt: skip
        except OSError as error:
            verdict = {"file": str(path), "ok": False, "field": None,
                       "error": error.strerror or str(error)}  # fmt: skip
        verdicts.append(verdict)
        if as_json:
            continue
        if verdict["ok"]:
            typer.echo(f"{path}: ok ({verdict['name']}, {verdict['rules']} rules)")
        elif verdict["field"]:
            typer.echo(f"{path}: {verdict['field']}: {verdict['error']}", err=True)
        else:
            typer.echo(f"{path}: {verdict['error']}", err=True)
    if as_json:
        emit_json(verdicts)
    if not all(v["ok"] for v in verdicts):
        raise typer.Exit(1)


def register(cli: typer.Typer) -> None:
    """Add `ckpt policies ...` to `cli`, and `ckpt policy ...` as its older name."""
    cli.add_typer(policies_cli, name="policies")
    cli.add_typer(policies_cli, name="policy", hidden=True)
