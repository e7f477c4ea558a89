"""From text to a validated Policy: YAML parsed safely, documents validated against the
configured tiers with errors that name the file, rule and field, policy files read from
a directory, and "a stored policy by name, or an inline one" resolved one way everywhere.
Pure: a stored policy is looked up through the function the caller passes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from app.domain.errors import Invalid, NotFound
from app.policy.schema import Policy


class PolicyFileError(Exception):
    """A policy file is invalid; the message names the file, the rule and the field."""


def _loc(loc: tuple[int | str, ...], document: Any) -> str:
    """`rules[1] (milestones-thin).keep_last` from a pydantic error location."""
    out = ""
    node = document
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "policy"


def describe(error: ValidationError, document: Any) -> tuple[str, str]:
    """(first field, message naming every field at fault)."""
    items = error.errors()
    parts = [
        f"{_loc(tuple(item['loc']), document)}: {str(item['msg']).removeprefix('Value error, ')}"
        for item in items
    ]
    first = _loc(tuple(items[0]["loc"]), document) if items else "policy"
    return first, "; ".join(parts)


def validate_policy(document: Any, tiers: list[str]) -> Policy:
    """Validate a policy document against the configured tiers; raises Invalid naming the field."""
    if not isinstance(document, dict):
        raise Invalid("a policy must be a mapping with name and rules", field="policy")
    try:
        return Policy.model_validate(document, context={"tiers": tiers})
    except ValidationError as error:
        field, message = describe(error, document)
        raise Invalid(message, field=field) from None


def parse_yaml(text: str | bytes, *, field: str = "body") -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise Invalid(f"not valid YAML: {error}", field=field) from None
    except Exception as error:
        # PyYAML's constructors crash in many ways on odd input (a sign and underscores
        # read as a float, `!!bool maybe`, `!!timestamp x`, deep nesting): still the
        # client's bad input, never a 500.
        raise Invalid(f"not valid YAML: {type(error).__name__}", field=field) from None


def load_policy_files(directory: Path, tiers: list[str]) -> list[tuple[Path, Policy]]:
    """Every `*.yaml`/`*.yml` policy in `directory`, validated; the first bad file raises."""
    if not directory.is_dir():
        return []
    loaded: list[tuple[Path, Policy]] = []
    names: dict[str, Path] = {}
    for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
        try:
            policy = validate_policy(parse_yaml(path.read_text()), tiers)
        except Invalid as error:
            raise PolicyFileError(f"policy file {path}: {error.message}") from None
        if policy.name in names:
            raise PolicyFileError(
                f"policy file {path}: name {policy.name!r} is also used by {names[policy.name]}"
            )
        names[policy.name] = path
        loaded.append((path, policy))
    return loaded


def to_document(policy: Policy) -> dict[str, Any]:
    return policy.model_dump(mode="json", by_alias=True, exclude_defaults=True)


def resolve(
    policy: str | Mapping[str, Any],
    tiers: list[str],
    stored: Callable[[str], Any] | None,
    *,
    message_names_field: bool = True,
) -> Policy:
    """A stored policy by name (`stored(name)` returns its document or raises NotFound), or
    an inline policy document; errors in an inline one are named under `policy.`. Without
    `stored` only inline documents resolve. With `message_names_field` False the message
    leaves out the field it is about (which the problem's `field` already names)."""
    if isinstance(policy, str):
        try:
            if stored is None:
                raise NotFound(f"no policy is named {policy!r}", field="policy")
            document = stored(policy)
        except NotFound:
            raise NotFound(f"no policy is named {policy!r}", field="policy") from None
        return validate_policy(document, tiers)
    try:
        return validate_policy(dict(policy), tiers)
    except Invalid as error:
        inner = error.field or ""
        message = error.message
        if not message_names_field and inner:
            message = message.removeprefix(f"{inner}: ")
        raise Invalid(message, field=f"policy.{inner}" if inner else "policy") from None
