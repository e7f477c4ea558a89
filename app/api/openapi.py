"""The error answers in the OpenAPI document: every status an operation can answer with,
each as the problem document (RFC 9457, `application/problem+json`) it really is.

FastAPI documents only a 422 in its own `application/json` shape. The statuses here follow
from what an operation has (a token rule, path ids, a body, a cursor) plus a short table of
the conflicts and outages of particular operations, so a client generated from the document
knows every answer it may get.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from app.api.auth import RULES
from app.domain.tier import Tier
from app.policy.schema import Policy

PROBLEM_MEDIA = "application/problem+json"

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "type": "object",
    "description": "RFC 9457 problem details; `field` names the input at fault, when one is",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "what went wrong, for a person"},
        "field": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "errors": {
            "type": "array",
            "description": "every field at fault, when the input broke several rules",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}

WHY = {
    400: "malformed JSON, or a cursor this list did not hand out",
    401: "no token, or an unknown or revoked one",
    403: "the token lacks the scope or the project this needs",
    404: "an id or name in the request names nothing",
    409: "the request conflicts with the state of what it names",
    415: "the body was not sent as the media type the operation reads",
    422: "an input breaks a rule of the contract (an unknown query parameter included)",
    503: "a storage tier could not be reached; retrying may succeed",
}

# Statuses that only particular operations answer, beyond those their shape implies.
EXTRA: Mapping[tuple[str, str], tuple[int, ...]] = MappingProxyType(
    {
        ("POST", "/v1/runs"): (404,),  # resumed_from names no checkpoint
        ("POST", "/v1/runs/{run_id}/checkpoints"): (409, 503),
        ("POST", "/v1/checkpoints/{checkpoint_id}/commit"): (409, 503),
        ("POST", "/v1/checkpoints/{checkpoint_id}/keepalive"): (409,),  # not writing
        ("POST", "/v1/checkpoints/{checkpoint_id}/abort"): (409,),  # not writing, or pinned
        ("PATCH", "/v1/checkpoints/{checkpoint_id}"): (409,),  # deleted
        ("POST", "/v1/checkpoints/{checkpoint_id}/pin"): (409,),
        ("DELETE", "/v1/checkpoints/{checkpoint_id}"): (409,),
        ("POST", "/v1/checkpoints/{checkpoint_id}/undelete"): (409,),
        ("POST", "/v1/checkpoints/{checkpoint_id}/restore"): (409,),
        ("PATCH", "/v1/runs/{run_id}"): (),
        ("POST", "/v1/plan"): (404,),  # project, run_id or policy names nothing
        ("POST", "/v1/sweeps"): (404,),
        ("POST", "/v1/forecast"): (404,),  # policy names nothing
        ("POST", "/v1/backtest"): (404,),  # project, run_id or policy names nothing
        # nothing stored under the uri; inside a catalogued checkpoint; the store is down
        ("POST", "/v1/imports"): (404, 409, 503),
    }
)


def statuses(method: str, path: str, operation: Mapping[str, Any]) -> list[int]:
    """Every error status this operation answers with."""
    found = {422}  # every operation refuses a query parameter it does not take
    rule = RULES.get((method, path))
    if rule is not None and rule.scope is not None:
        found |= {401, 403}
    parameters = operation.get("parameters", [])
    if any(p.get("in") == "path" for p in parameters):
        found.add(404)
    if any(p.get("in") == "query" and p.get("name") == "cursor" for p in parameters):
        found.add(400)
    if "requestBody" in operation:
        found |= {400, 415}
    found |= set(EXTRA.get((method, path), ()))
    return sorted(found)


def document_problems(schema: dict[str, Any]) -> None:
    """Replace FastAPI's 422 with the problem document and add every other error status."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Problem"] = PROBLEM_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    reference = {"$ref": "#/components/schemas/Problem"}
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            responses = operation.setdefault("responses", {})
            for status in statuses(method.upper(), path, operation):
                responses[str(status)] = {
                    "description": WHY[status],
                    "content": {PROBLEM_MEDIA: {"schema": reference}},
                }


# Lists whose cursor carries a number (a step, a rank, an event id); the others carry an id.
NUMBER_CURSORS = frozenset({"/v1/audit", "/v1/runs/{run_id}/checkpoints", "/v1/tiers"})
CURSOR_FORMATS = ("ckpt-cursor-number", "ckpt-cursor-id")


def _closed_key_patterns(node: Any) -> None:
    """pydantic writes a map whose keys follow a pattern as `patternProperties` alone, which
    lets any other key through; the service refuses those keys, so the document does too,
    as `propertyNames` (which generated clients read) and `additionalProperties`."""
    if isinstance(node, dict):
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict) and len(patterns) == 1 and "additionalProperties" not in node:
            ((pattern, values),) = patterns.items()
            del node["patternProperties"]
            node["propertyNames"] = {**node.get("propertyNames", {}), "pattern": pattern}
            node["additionalProperties"] = values
        for value in node.values():
            _closed_key_patterns(value)
    elif isinstance(node, list):
        for value in node:
            _closed_key_patterns(value)


def document_inputs(schema: dict[str, Any], tiers: list[Tier]) -> None:
    """What the app knows and JSON Schema can say: the configured tiers' names where a body
    takes a tier, the tiers' urls a registered uri must lie under, and a cursor's kind (an
    opaque string no generator can guess: `format` names which list handed it out)."""
    names = [t.name for t in tiers]
    components = schema.get("components", {}).get("schemas", {})
    _closed_key_patterns(components)
    for model, field in (("RestoreRequest", "tier"), ("OrphanRef", "tier")):
        prop = components.get(model, {}).get("properties", {}).get(field)
        if prop is not None:
            prop["enum"] = names
    prices = components.get("ForecastRequest", {}).get("properties", {}).get("prices", {})
    for branch in prices.get("anyOf", []):
        if branch.get("type") == "object":
            branch["propertyNames"] = {"enum": names}
    uri = components.get("CheckpointCreate", {}).get("properties", {}).get("uri")
    if uri is not None and tiers:
        prefixes = "|".join(re.escape(t.url.rstrip("/") + "/") for t in tiers)
        uri["pattern"] = f"^(?:{prefixes})[^/]"
        uri["description"] = "under one of the tiers' urls"
    tree = components.get("ImportCreate", {}).get("properties", {}).get("uri")
    if tree is not None and tiers:
        roots = "|".join(re.escape(t.url.rstrip("/")) for t in tiers)
        tree["pattern"] = f"^(?:{roots})(?:/?$|/[^/])"
        tree["description"] = "one of the tiers' urls, or a path under one"
    for path, item in schema.get("paths", {}).items():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "query" and parameter.get("name") == "cursor":
                    target = parameter["schema"]
                    target = next(
                        (s for s in target.get("anyOf", []) if s.get("type") == "string"), target
                    )
                    target["format"] = CURSOR_FORMATS[0 if path in NUMBER_CURSORS else 1]


def document_policies(schema: dict[str, Any], tiers: list[Tier]) -> None:
    """A policy body is the policy language's own schema (YAML or JSON alike), its tiers the
    configured ones. The one rule JSON Schema cannot say, rule names unique within a policy,
    is said in words."""
    names = [t.name for t in tiers]
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    policy = Policy.model_json_schema(
        by_alias=True, ref_template="#/components/schemas/policy.{model}"
    )
    for name, sub in policy.pop("$defs", {}).items():
        components[f"policy.{name}"] = sub
    policy["properties"]["rules"]["description"] = "rule names are unique within a policy"
    components["policy.Policy"] = policy
    action = components["policy.Rule"]["properties"]["action"]
    # objects first: a generated client tries the members in order, and some generators
    # give up at a constant that does not match instead of trying the next member
    action["anyOf"].sort(key=lambda member: "$ref" not in member)
    components["policy.MoveTo"]["properties"]["move_to"]["enum"] = names
    components["policy.CopyTo"]["properties"]["copy_to"]["enum"] = names
    for branch in components["policy.When"]["properties"]["on_tier"].get("anyOf", []):
        if branch.get("type") == "array":
            branch["items"]["enum"] = names
    body = copy.deepcopy(policy)  # PUT: the name is the path's
    del body["properties"]["name"]
    body["required"] = [r for r in body.get("required", []) if r != "name"]
    body["title"] = "PolicyBody"
    components["policy.PolicyBody"] = body
    reference = {"$ref": "#/components/schemas/policy.PolicyBody"}
    put = schema["paths"]["/v1/policies/{name}"]["put"]["requestBody"]["content"]
    for media in put.values():
        media["schema"] = reference
    for model in ("PlanRequest", "ForecastRequest", "BacktestRequest"):
        field = components.get(model, {}).get("properties", {}).get("policy", {})
        field["anyOf"] = [
            {"$ref": "#/components/schemas/policy.Policy"} if b.get("type") == "object" else b
            for b in field.get("anyOf", [])
        ]
