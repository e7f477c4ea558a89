"""The policy parser and validator take anything: arbitrary text and bytes, YAML-ish
documents and arbitrary nested structures come out as a Policy or as the one documented
refusal, `Invalid` (422) naming the field at fault, never as another exception. A valid
policy spoiled in one place is refused naming that place."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.domain.errors import Invalid
from app.policy.loading import parse_yaml, validate_policy
from app.policy.schema import Policy

TIERS = ["hot", "warm", "cold", "archive"]
TOP_KEYS = ["name", "description", "applies_to", "priority", "rules"]
RULE_KEYS = [
    "name",
    "class",
    "when",
    "keep_last",
    "keep_best",
    "keep_every",
    "keep_within",
    "keep_hourly",
    "keep_daily",
    "keep_weekly",
    "keep_monthly",
    "keep_yearly",
    "action",
]
NESTED_KEYS = [
    "projects",
    "labels",
    "age",
    "run_ended",
    "run_status",
    "on_tier",
    "metric",
    "mode",
    "count",
    "steps",
    "move_to",
    "copy_to",
]
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(document: Any) -> Policy | Invalid:
    try:
        return validate_policy(document, TIERS)
    except Invalid as error:
        return error


def parsed_outcome(text: str | bytes) -> Policy | Invalid:
    try:
        document = parse_yaml(text)
    except Invalid as error:
        return error
    return outcome(document)


def assert_documented(result: Policy | Invalid) -> None:
    """A policy, or a 422 refusal that names a field and says what is wrong with it."""
    if isinstance(result, Policy):
        return
    assert result.status == 422
    assert isinstance(result.field, str) and result.field, result.message
    assert result.message.strip()


# -- strategies ---------------------------------------------------------------------------------

keys = st.sampled_from(TOP_KEYS + RULE_KEYS + NESTED_KEYS) | st.text(max_size=8)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-3, max_value=3)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["delete", "7d", "90s", "12h", "-1d", "0s", "min", "max", "*", "hot", "x"])
    | st.dates()
    | st.datetimes()
    | st.binary(max_size=8)
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5),
    max_leaves=12,
)
documents = st.dictionaries(keys, values, max_size=7) | values

YAML_TOKENS = [
    "name: ",
    "rules:",
    "\n",
    "\n  ",
    "\n    ",
    "- ",
    "class: ",
    "keep_last: ",
    "keep_best: {metric: loss, mode: min, count: 2}",
    "action: ",
    "delete",
    "{move_to: cold}",
    "{copy_to: nowhere}",
    "when: ",
    "{run_ended: 7d}",
    "{age: 3x}",
    "applies_to: ",
    "{projects: ['*'], labels: {a: b}}",
    "priority: ",
    "&a ",
    "*a",
    "<<: *a",
    "!!str ",
    "!!int ",
    "!!float ",
    "!!binary ",
    "!!set ",
    "!!omap ",
    "!!timestamp ",
    "!!python/name:os.system ",
    "[",
    "]",
    "{",
    "}",
    ", ",
    ": ",
    "? ",
    "'",
    '"',
    "# comment",
    "---\n",
    "...\n",
    "|\n  ",
    ">\n  ",
    "%YAML 1.1\n",
    "~",
    "null",
    "-1",
    "-2",
    "3",
    "1e309",
    ".nan",
    ".inf",
    "0x1F",
    "2020-01-01",
    "2020-01-01T00:00:00Z",
    "yes",
    "\t",
    "\x00",
    "\ufeff",
]
yamlish = st.lists(st.sampled_from(YAML_TOKENS) | st.text(max_size=4), max_size=40).map("".join)

names = st.from_regex(r"\A[a-z0-9][a-z0-9._-]{0,12}\Z")
actions = st.sampled_from(["delete", {"move_to": "cold"}, {"copy_to": "archive"}])


@st.composite
def valid_policies(draw: st.DrawFn) -> dict[str, Any]:
    rule_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    rules = []
    for rule_name in rule_names:
        rule: dict[str, Any] = {"name": rule_name, "action": draw(actions)}
        if draw(st.booleans()):
            rule["keep_last"] = draw(st.integers(min_value=-1, max_value=10))
        if draw(st.booleans()):
            rule["class"] = draw(st.sampled_from(["rolling", "milestone", ["final"]]))
        if draw(st.booleans()):
            rule["when"] = {"run_ended": draw(st.sampled_from(["0s", "7d", "12h"]))}
        rules.append(rule)
    return {"name": draw(names), "rules": rules}


# -- properties ---------------------------------------------------------------------------------


@FUZZ
@given(st.text())
def test_any_text_is_a_policy_or_a_refusal(text: str) -> None:
    assert_documented(parsed_outcome(text))


@FUZZ
@given(st.binary())
def test_any_bytes_are_a_policy_or_a_refusal(data: bytes) -> None:
    assert_documented(parsed_outcome(data))


@FUZZ
@given(yamlish)
def test_yaml_ish_text_is_a_policy_or_a_refusal(text: str) -> None:
    assert_documented(parsed_outcome(text))


@FUZZ
@given(documents)
def test_any_nested_structure_is_a_policy_or_a_refusal(document: Any) -> None:
    assert_documented(outcome(document))


@FUZZ
@given(documents)
def test_any_nested_structure_written_as_yaml_is_a_policy_or_a_refusal(document: Any) -> None:
    assert_documented(parsed_outcome(yaml.safe_dump(document)))


@FUZZ
@given(valid_policies())
def test_valid_policies_pass_as_yaml(document: dict[str, Any]) -> None:
    assert isinstance(parsed_outcome(yaml.safe_dump(document)), Policy)


@FUZZ
@given(valid_policies(), st.sampled_from(TOP_KEYS) | st.text(min_size=1, max_size=8), values)
def test_a_spoiled_top_level_field_is_the_one_named(
    document: dict[str, Any], key: str, value: Any
) -> None:
    result = parsed_outcome(yaml.safe_dump({**document, key: value}))
    assert_documented(result)
    if isinstance(result, Invalid):
        field = result.field or ""
        # rules whose names repeat: the policy as a whole is refused
        assert _names(field, key) or (key == "rules" and field == "policy"), (field, key)


@FUZZ
@given(valid_policies(), st.data(), st.sampled_from(RULE_KEYS) | st.text(min_size=1, max_size=8))
def test_a_spoiled_rule_field_names_that_rule(
    document: dict[str, Any], data: st.DataObject, key: str
) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(document["rules"]) - 1))
    value = data.draw(values)
    rules = [dict(rule) for rule in document["rules"]]
    rules[index][key] = value
    result = parsed_outcome(yaml.safe_dump({**document, "rules": rules}))
    assert_documented(result)
    if isinstance(result, Invalid):
        field = result.field or ""
        # a renamed rule may clash with another: the policy as a whole is refused then
        clash = key == "name" and field == "policy"
        assert field.startswith(f"rules[{index}]") or clash, (field, key)


def _names(field: str, key: str) -> bool:
    return field == key or field.startswith((f"{key}.", f"{key}[", f"{key} ("))


# What PyYAML fails to construct with something other than a YAMLError.
UNCONSTRUCTIBLE = {
    "an impossible date": "name: p\ndescription: 2020-02-30\nrules: []\n",
    "year zero": "name: p\nrules: [{name: r, when: {age: 0000-01-01}, action: delete}]\n",
    "an int tag on a word": "name: p\nrules: [{name: r, keep_last: !!int x, action: delete}]\n",
    "an int tag on nothing": "name: p\npriority: !!int ''\n",
    "deep nesting": "[" * 600 + "]" * 600,
    "a bool tag on a word": "name: p\npriority: !!bool maybe\n",
    "a timestamp tag on a word": "name: !!timestamp x\n",
}


@pytest.mark.parametrize("text", UNCONSTRUCTIBLE.values(), ids=UNCONSTRUCTIBLE.keys())
def test_yaml_that_pyyaml_cannot_construct_is_refused(text: str) -> None:
    result = parsed_outcome(text)
    assert isinstance(result, Invalid) and result.field == "body", result
    assert "YAML" in result.message
