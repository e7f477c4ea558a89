"""The policy language (DESIGN section 7): what parses, and what is refused and where."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from app.policy.schema import CopyTo, MoveTo, Policy
from tests.unit.engine_builders import TIERS

DESIGN_EXAMPLE = """
name: llm-default
description: 3 rolling hot; thin and cool milestones after the run; archive finals
applies_to: {projects: ["*"], labels: {}}   # optional, default every run
priority: 0                                 # highest matching policy governs a run
rules:
  - name: rolling-keep-3
    class: rolling
    keep_last: 3
    action: delete
  - name: milestones-thin
    class: milestone
    when: {run_ended: 7d}
    keep_best: {metric: eval_loss, mode: min, count: 5}
    keep_last: 1
    action: delete
  - name: milestones-cold
    class: milestone
    when: {run_ended: 30d}
    action: {move_to: cold}
  - name: final-archive
    class: final
    when: {run_ended: 0s}
    action: {copy_to: archive}
"""


def validate(data: dict[str, Any], tiers: tuple[str, ...] = TIERS) -> Policy:
    return Policy.model_validate(data, context={"tiers": list(tiers)})


def one_rule(**fields: Any) -> dict[str, Any]:
    rule: dict[str, Any] = {"name": "r", "action": "delete"}
    rule.update(fields)
    return {"name": "p", "rules": [rule]}


def refusal(data: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as caught:
        validate(data)
    return [dict(error) for error in caught.value.errors()]


def assert_refused_at(data: dict[str, Any], loc: tuple[str | int, ...], text: str = "") -> None:
    errors = refusal(data)
    locs = [tuple(e["loc"]) for e in errors]
    assert loc in locs, f"expected an error at {loc}, got {locs}"
    if text:
        messages = " | ".join(str(e["msg"]) for e in errors if tuple(e["loc"]) == loc)
        assert text in messages, messages


# -- the example of DESIGN section 7 --------------------------------------------------------


def test_design_example_parses() -> None:
    policy = validate(yaml.safe_load(DESIGN_EXAMPLE))
    assert policy.name == "llm-default"
    assert policy.priority == 0
    assert policy.applies_to.projects == ["*"]
    assert policy.applies_to.labels == {}
    assert [r.name for r in policy.rules] == [
        "rolling-keep-3",
        "milestones-thin",
        "milestones-cold",
        "final-archive",
    ]
    rolling, thin, cold, final = policy.rules
    assert rolling.classes == frozenset({"rolling"})
    assert rolling.keep_last == 3
    assert rolling.action == "delete"
    assert thin.when.run_ended == timedelta(days=7)
    assert thin.keep_best is not None
    assert (thin.keep_best.metric, thin.keep_best.mode, thin.keep_best.count) == (
        "eval_loss",
        "min",
        5,
    )
    assert thin.keep_last == 1
    assert cold.action == MoveTo(move_to="cold")
    assert cold.target_tier == "cold"
    assert cold.when.run_ended == timedelta(days=30)
    assert final.action == CopyTo(copy_to="archive")
    assert final.when.run_ended == timedelta(0)


def test_defaults_when_optional_parts_are_omitted() -> None:
    policy = validate({"name": "bare"})
    assert policy.applies_to.projects == ["*"]
    assert policy.applies_to.labels == {}
    assert policy.priority == 0
    assert policy.rules == []
    rule = validate(one_rule()).rules[0]
    assert rule.classes is None  # omitted class = all classes
    assert rule.when.age is None
    assert rule.describe_keeps() == []


def test_class_may_be_a_list() -> None:
    rule = validate(one_rule(**{"class": ["rolling", "milestone"]})).rules[0]
    assert rule.classes == frozenset({"rolling", "milestone"})


def test_all_when_conditions_parse() -> None:
    when = {"age": "90s", "run_ended": "12h", "run_status": ["completed", "failed"]}
    rule = validate(one_rule(when={**when, "on_tier": ["hot", "warm"]})).rules[0]
    assert rule.when.age == timedelta(seconds=90)
    assert rule.when.run_ended == timedelta(hours=12)
    assert rule.when.run_status == ["completed", "failed"]
    assert rule.when.on_tier == ["hot", "warm"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0s", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("12h", timedelta(hours=12)),
        ("30d", timedelta(days=30)),
        ("2w", timedelta(weeks=2)),
    ],
)
def test_durations_parse(text: str, expected: timedelta) -> None:
    assert validate(one_rule(keep_within=text)).rules[0].keep_within == expected


@pytest.mark.parametrize(
    "field",
    ["keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly"],
)
@pytest.mark.parametrize("count", [-1, 0, 1, 7])
def test_counts_accept_zero_positive_and_minus_one_for_all(field: str, count: int) -> None:
    assert getattr(validate(one_rule(**{field: count})).rules[0], field) == count


def test_keep_best_count_minus_one_means_all() -> None:
    rule = validate(one_rule(keep_best={"metric": "loss", "mode": "max", "count": -1})).rules[0]
    assert rule.keep_best is not None
    assert rule.keep_best.count == -1


def test_tiers_are_not_checked_without_a_tier_context() -> None:
    policy = Policy.model_validate(one_rule(action={"move_to": "anywhere"}))
    assert policy.rules[0].target_tier == "anywhere"


# -- refusals, each naming the rule index and the field -------------------------------------

UNKNOWN_FIELDS: list[tuple[dict[str, Any], tuple[str | int, ...]]] = [
    ({"name": "p", "schedule": "daily"}, ("schedule",)),
    ({"name": "p", "applies_to": {"project": ["x"]}}, ("applies_to", "project")),
    (one_rule(keep_newest=3), ("rules", 0, "keep_newest")),
    (one_rule(when={"older_than": "7d"}), ("rules", 0, "when", "older_than")),
    (
        one_rule(keep_best={"metric": "loss", "mode": "min", "count": 1, "top": 2}),
        ("rules", 0, "keep_best", "top"),
    ),
    (one_rule(keep_every={"steps": 100, "offset": 5}), ("rules", 0, "keep_every", "offset")),
]


@pytest.mark.parametrize(("data", "loc"), UNKNOWN_FIELDS)
def test_unknown_fields_are_refused(data: dict[str, Any], loc: tuple[str | int, ...]) -> None:
    assert_refused_at(data, loc, "Extra inputs are not permitted")


def test_unknown_field_in_a_later_rule_names_that_rule_index() -> None:
    data = {
        "name": "p",
        "rules": [
            {"name": "a", "keep_last": 1, "action": "delete"},
            {"name": "b", "keep_lats": 1, "action": "delete"},
        ],
    }
    assert_refused_at(data, ("rules", 1, "keep_lats"))


@pytest.mark.parametrize(
    "action", [{"move_to": "glacier"}, {"copy_to": "tape"}], ids=["move_to", "copy_to"]
)
def test_unknown_target_tier_is_refused(action: dict[str, str]) -> None:
    data = {
        "name": "p",
        "rules": [
            {"name": "ok", "action": "delete"},
            {"name": "bad", "action": action},
        ],
    }
    target = next(iter(action.values()))
    assert_refused_at(data, ("rules", 1, "action"), f"unknown tier {target!r}")


def test_unknown_on_tier_is_refused() -> None:
    errors = refusal(one_rule(when={"on_tier": ["hot", "nvme"]}))
    assert [tuple(e["loc"]) for e in errors] == [("rules", 0, "when")]
    assert "on_tier" in errors[0]["msg"]
    assert "'nvme'" in errors[0]["msg"]


def test_tiers_from_the_context_decide_what_is_known() -> None:
    custom = ("fast", "slow")
    Policy.model_validate(one_rule(action={"move_to": "slow"}), context={"tiers": list(custom)})
    with pytest.raises(ValidationError):
        Policy.model_validate(one_rule(action={"move_to": "cold"}), context={"tiers": list(custom)})


@pytest.mark.parametrize(
    "field",
    ["keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly"],
)
@pytest.mark.parametrize("count", [-2, -100])
def test_counts_below_minus_one_are_refused(field: str, count: int) -> None:
    assert_refused_at(one_rule(**{field: count}), ("rules", 0, field), "negative")


def test_keep_best_count_below_minus_one_is_refused() -> None:
    data = one_rule(keep_best={"metric": "loss", "mode": "min", "count": -2})
    assert_refused_at(data, ("rules", 0, "keep_best", "count"), "negative")


@pytest.mark.parametrize("count", ["3", 1.5, True, None, [3]])
def test_non_integer_counts_are_refused(count: object) -> None:
    data = one_rule(keep_best={"metric": "loss", "mode": "min", "count": count})
    assert_refused_at(data, ("rules", 0, "keep_best", "count"))


def test_a_whole_float_count_is_that_integer() -> None:
    # 3.0 is the integer 3 to JSON Schema, and so to the clients generated from it
    policy = Policy.model_validate(one_rule(keep_last=3.0), context={"tiers": TIERS})
    assert policy.rules[0].keep_last == 3 and isinstance(policy.rules[0].keep_last, int)


def test_an_action_with_an_extra_key_is_no_action() -> None:
    data = one_rule(action={"move_to": "cold", "after": "7d"})
    assert_refused_at(data, ("rules", 0, "action"), "the actions are delete")


@pytest.mark.parametrize("count", ["3", 1.5, True, [3]])
def test_non_integer_keep_last_is_refused(count: object) -> None:
    assert_refused_at(one_rule(keep_last=count), ("rules", 0, "keep_last"), "integer")


@pytest.mark.parametrize("steps", [0, -5, 1.5])
def test_keep_every_needs_a_positive_whole_step(steps: object) -> None:
    assert_refused_at(one_rule(keep_every={"steps": steps}), ("rules", 0, "keep_every", "steps"))


@pytest.mark.parametrize("text", ["7days", "1.5h", "7", "d7", "-1d", "7 d", "", "7y", "7D"])
@pytest.mark.parametrize("field", ["age", "run_ended"])
def test_malformed_durations_in_when_are_refused(field: str, text: str) -> None:
    assert_refused_at(one_rule(when={field: text}), ("rules", 0, "when", field), "duration")


@pytest.mark.parametrize("value", ["7days", "1.5h", 7, 1.5])
def test_malformed_keep_within_is_refused(value: object) -> None:
    assert_refused_at(one_rule(keep_within=value), ("rules", 0, "keep_within"), "duration")


def test_duplicate_rule_names_are_refused_naming_the_rule() -> None:
    data = {
        "name": "p",
        "rules": [
            {"name": "same", "action": "delete"},
            {"name": "other", "action": "delete"},
            {"name": "same", "keep_last": 2, "action": "delete"},
        ],
    }
    errors = refusal(data)
    assert any("'same'" in str(e["msg"]) and "twice" in str(e["msg"]) for e in errors), errors


@pytest.mark.parametrize(
    "name", ["", "Upper", "-leading-dash", "has space", "a/b", "x" * 64, "ümlaut"]
)
def test_bad_policy_names_are_refused(name: str) -> None:
    assert_refused_at({"name": name}, ("name",))


@pytest.mark.parametrize("name", ["a", "llm-default", "v1.2_final", "0abc", "x" * 63])
def test_good_policy_names_parse(name: str) -> None:
    assert validate({"name": name}).name == name


def test_bad_rule_name_is_refused() -> None:
    assert_refused_at(one_rule(name="Bad Name"), ("rules", 0, "name"))


def test_missing_action_is_refused() -> None:
    data = {"name": "p", "rules": [{"name": "r", "keep_last": 1}]}
    assert_refused_at(data, ("rules", 0, "action"), "Field required")


def test_unknown_action_is_refused() -> None:
    errors = refusal(one_rule(action="remove"))
    assert all(tuple(e["loc"])[:3] == ("rules", 0, "action") for e in errors), errors


@pytest.mark.parametrize(
    ("when", "field"),
    [({"run_status": ["running"]}, "run_status"), ({"run_status": "completed"}, "run_status")],
)
def test_bad_run_status_is_refused(when: dict[str, Any], field: str) -> None:
    errors = refusal(one_rule(when=when))
    assert all(tuple(e["loc"])[:4] == ("rules", 0, "when", field) for e in errors), errors


def test_bad_keep_best_mode_is_refused() -> None:
    data = one_rule(keep_best={"metric": "loss", "mode": "lowest", "count": 1})
    assert_refused_at(data, ("rules", 0, "keep_best", "mode"))


def test_empty_projects_list_is_refused() -> None:
    assert_refused_at({"name": "p", "applies_to": {"projects": []}}, ("applies_to", "projects"))
