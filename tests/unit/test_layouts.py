"""Recognising the checkpoints of a tree nobody catalogued (DESIGN section 14), from the
keys a store lists in sorted order: each layout's checkpoint, its step and run, the
incomplete ones with their reason, and everything else counted as unrecognised."""

from __future__ import annotations

from collections.abc import Iterable
from unittest.mock import patch

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from app.domain import layouts
from app.domain.layouts import (
    LAYOUTS,
    Found,
    Incomplete,
    Recognizer,
    hf_metrics,
    normalise,
    run_name,
)


def recognise(
    keys: Iterable[str], layout: str = "auto"
) -> tuple[list[Found[int]], list[Incomplete], int]:
    recognizer: Recognizer[int] = Recognizer(layout)
    settled: list[Found[int] | Incomplete] = []
    for key in sorted(keys):
        settled.extend(recognizer.add(key, len(key)))  # the "info": what a listing says
    settled.extend(recognizer.finish())
    found = [s for s in settled if isinstance(s, Found)]
    incomplete = [s for s in settled if isinstance(s, Incomplete)]
    return found, incomplete, recognizer.unrecognized


def summary(found: list[Found[int]]) -> list[tuple[str, str, int, str]]:
    return [(f.layout, f.key, f.step, f.run_path) for f in found]


def test_each_layout_is_recognised_from_its_own_tree() -> None:
    keys = [
        "hf/run-a/checkpoint-500/trainer_state.json",
        "hf/run-a/checkpoint-500/model.safetensors",
        "hf/run-a/checkpoint-500/global_step500/mp_rank_00_model_states.pt",  # DeepSpeed inside
        "pl/run-b/checkpoints/epoch=0-step=100.ckpt",
        "pl/run-b/checkpoints/last.ckpt",
        "tt/run-c/checkpoint/step-20/.metadata",
        "tt/run-c/checkpoint/step-20/__0_0.distcp",
        "ox/run-d/7/_CHECKPOINT_METADATA",
        "ox/run-d/7/default/manifest.ocdbt",
        "ox/run-d/8/commit_success.txt",
        "mg/run-e/iter_0001000/mp_rank_00/model_optim_rng.pt",
        "ds/run-f/global_step30/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "gen/run-g/step_4/weights.bin",
        "gen/run-g/step-5/weights.bin",
    ]
    found, incomplete, unrecognized = recognise(keys)

    assert summary(found) == [
        ("deepspeed", "ds/run-f/global_step30", 30, "ds/run-f"),
        ("generic", "gen/run-g/step-5", 5, "gen/run-g"),  # step-<N>/ without .metadata
        ("generic", "gen/run-g/step_4", 4, "gen/run-g"),
        ("hf", "hf/run-a/checkpoint-500", 500, "hf/run-a"),
        ("megatron", "mg/run-e/iter_0001000", 1000, "mg/run-e"),
        ("orbax", "ox/run-d/7", 7, "ox/run-d"),
        ("orbax", "ox/run-d/8", 8, "ox/run-d"),
        ("lightning", "pl/run-b/checkpoints/epoch=0-step=100.ckpt", 100, "pl/run-b/checkpoints"),
        ("dcp", "tt/run-c/checkpoint/step-20", 20, "tt/run-c/checkpoint"),
    ]
    hf = next(f for f in found if f.layout == "hf")
    assert hf.names == (
        "global_step500/mp_rank_00_model_states.pt",
        "model.safetensors",
        "trainer_state.json",
    )
    assert next(f for f in found if f.layout == "lightning").single_file
    assert incomplete == [] and unrecognized == 1  # last.ckpt, an alias


def test_incomplete_checkpoints_are_reported_with_their_reason_and_never_found() -> None:
    keys = [
        "a/checkpoint-10/model.safetensors",  # no trainer_state.json
        "a/checkpoint-20/trainer_state.json",
        "b/3.orbax-checkpoint-tmp-1733/default/d/0a1b",
        "b/3.orbax-checkpoint-tmp-1733/_CHECKPOINT_METADATA",
        "b/2/_CHECKPOINT_METADATA",
    ]
    found, incomplete, _ = recognise(keys)
    assert summary(found) == [
        ("hf", "a/checkpoint-20", 20, "a"),
        ("orbax", "b/2", 2, "b"),
    ]
    assert [(i.key, i.reason) for i in incomplete] == [
        ("a/checkpoint-10", "no trainer_state.json"),
        (
            "b/3.orbax-checkpoint-tmp-1733",
            "an orbax save that never finished (a temporary directory)",
        ),
    ]
    _, dcp_incomplete, _ = recognise(["x/step-9/__0_0.distcp"], layout="dcp")
    assert [(i.key, i.reason) for i in dcp_incomplete] == [("x/step-9", "no .metadata")]


def test_a_number_above_the_steps_is_not_taken_for_a_checkpoint() -> None:
    keys = [
        "runs/2024/.hidden",  # sorts before the steps: the folder is seen first
        "runs/2024/5/_CHECKPOINT_METADATA",
        "runs/2024/5/default/manifest.ocdbt",
        "runs/2024/6/_CHECKPOINT_METADATA",
        "runs/2024/notes.txt",
    ]
    found, incomplete, unrecognized = recognise(keys)
    assert summary(found) == [
        ("orbax", "runs/2024/5", 5, "runs/2024"),
        ("orbax", "runs/2024/6", 6, "runs/2024"),
    ]
    assert incomplete == [] and unrecognized == 2


def test_an_explicit_layout_recognises_only_its_own() -> None:
    keys = [
        "r/checkpoint-1/trainer_state.json",
        "r/step-2/.metadata",
        "r/step_3/w.bin",
        "r/epoch=0-step=4.ckpt",
    ]
    assert [f.key for f in recognise(keys, "hf")[0]] == ["r/checkpoint-1"]
    assert [f.key for f in recognise(keys, "dcp")[0]] == ["r/step-2"]
    assert [f.key for f in recognise(keys, "generic")[0]] == ["r/step-2", "r/step_3"]
    assert [f.key for f in recognise(keys, "lightning")[0]] == ["r/epoch=0-step=4.ckpt"]
    with pytest.raises(ValueError, match="unknown layout"):
        Recognizer("keras")


def test_runs_are_named_from_the_nearest_segment_that_is_not_a_container() -> None:
    assert run_name("team/Llama 70B/checkpoints", "bucket-root") == ("llama-70b", "Llama 70B")
    assert run_name("outputs/ckpt", "My_Run") == ("my_run", "My_Run")
    assert run_name("", "root") == ("root", "root")
    assert normalise("__Weird//Name!") == "weird--name-"
    assert normalise("!!!") == "run"
    assert len(normalise("x" * 200)) == 63


steps = st.integers(min_value=0, max_value=10**9)
files = st.lists(
    st.text("abcdefghij_.", min_size=1, max_size=8).filter(lambda n: n not in (".", "..")),
    min_size=1,
    max_size=4,
    unique=True,
)


@given(
    hf=st.dictionaries(steps, files, max_size=4),
    generic=st.dictionaries(steps, files, max_size=4),
    lightning=st.sets(steps, max_size=4),
)
def test_every_checkpoint_of_a_mixed_tree_is_found_once_with_all_its_files(
    hf: dict[int, list[str]], generic: dict[int, list[str]], lightning: set[int]
) -> None:
    keys = []
    for step, names in hf.items():
        keys += [f"run-h/checkpoint-{step}/trainer_state.json"]
        keys += [f"run-h/checkpoint-{step}/{n}" for n in names if n != "trainer_state.json"]
    for step, names in generic.items():
        keys += [f"run-g/step_{step}/{n}" for n in names]
    keys += [f"run-l/epoch=0-step={step}.ckpt" for step in lightning]

    found, incomplete, unrecognized = recognise(set(keys))

    assert incomplete == [] and unrecognized == 0
    by_key = {f.key: f for f in found}
    assert len(by_key) == len(found) == len(hf) + len(generic) + len(lightning)
    for step, names in hf.items():
        got = by_key[f"run-h/checkpoint-{step}"]
        assert (got.layout, got.step) == ("hf", step)
        assert set(got.names) == set(names) | {"trainer_state.json"}
        assert all(info == len(f"{got.key}/{name}") for name, info in got.files)
    for step, names in generic.items():
        got = by_key[f"run-g/step_{step}"]
        assert (got.layout, got.step, set(got.names)) == ("generic", step, set(names))
    for step in lightning:
        assert by_key[f"run-l/epoch=0-step={step}.ckpt"].step == step


def test_a_trainer_checkpoint_takes_the_last_eval_metrics_logged_at_or_before_its_step() -> None:
    state = {
        "log_history": [
            {"step": 10, "loss": 2.5},
            {"step": 10, "eval_loss": 2.4, "eval_accuracy": 0.31, "epoch": 1.0},
            {"step": 20, "eval_loss": 2.1, "eval_runtime": "n/a"},
            {"step": 30, "eval_loss": 1.9},  # after the checkpoint: a resumed run's future
            {"step": 20, "eval_flag": True},
            "garbage",
        ]
    }
    assert hf_metrics(state, 20) == {"eval_loss": 2.1, "eval_accuracy": 0.31}
    assert hf_metrics(state, 5) == {}
    assert hf_metrics({"log_history": "none"}, 20) == {}


segment = st.sampled_from(
    ["run", "checkpoints", "7", "12", "checkpoint-3", "step-5", "step_9", "iter_0000042",
     "global_step8", "3.orbax-checkpoint-tmp-1", "x.bin", "trainer_state.json", ".metadata",
     "_CHECKPOINT_METADATA", "epoch=0-step=4.ckpt", "last.ckpt", "a", "a.txt"]
)  # fmt: skip
tree_keys = st.sets(st.lists(segment, min_size=1, max_size=4).map("/".join), max_size=30)


@given(keys=tree_keys, data=st.data())
def test_a_listing_resumed_at_any_settled_key_recognises_the_same_tree(
    keys: set[str], data: st.DataObject
) -> None:
    """What a resumed import relies on: stopped at any key where nothing is still being
    gathered (`open_from` is None, or opened by the next key), and started afresh after
    it, the recognizer reports exactly what one pass reports, nothing twice."""
    ordered = sorted(k for k in keys if not any(o.startswith(k + "/") for o in keys))
    whole, whole_incomplete, whole_unrecognized = recognise(ordered)

    recognizer: Recognizer[int] = Recognizer()
    before: list[Found[int] | Incomplete] = []
    boundaries = [-1]  # resume after this index; -1: from the start
    results_at: dict[int, int] = {-1: 0}
    unrecognized_at: dict[int, int] = {-1: 0}
    for at, key in enumerate(ordered):
        before.extend(recognizer.add(key, len(key)))
        settled = at if recognizer.open_from is None else None
        if recognizer.open_from == key and at > 0:
            settled = at - 1  # this key opened a checkpoint: all before it is settled
        if settled is not None:
            boundaries.append(settled)
            results_at[settled], unrecognized_at[settled] = len(before), recognizer.unrecognized
    cut = data.draw(st.sampled_from(boundaries))
    first = before[: results_at[cut]]
    rest, rest_incomplete, rest_unrecognized = recognise(ordered[cut + 1 :])
    found = [r for r in first if isinstance(r, Found)] + rest
    incomplete = [r for r in first if isinstance(r, Incomplete)] + rest_incomplete
    assert summary(found) == summary(whole)
    assert incomplete == whole_incomplete
    assert unrecognized_at[cut] + rest_unrecognized == whole_unrecognized


@given(keys=tree_keys, layout=st.sampled_from(["auto", *LAYOUTS]))
def test_what_a_recognizer_remembers_of_directory_names_changes_nothing_it_reports(
    keys: set[str], layout: str
) -> None:
    """A recognizer works out what each directory name says once and remembers it, up to
    SEGMENT_MEMO names; one that forgets them all at every new name (a tree of more names
    than that) reports the same checkpoints, incomplete ones and unrecognised count."""
    ordered = sorted(k for k in keys if not any(o.startswith(k + "/") for o in keys))
    remembered = recognise(ordered, layout)
    with patch.object(layouts, "SEGMENT_MEMO", 1):
        forgetful = recognise(ordered, layout)
    assert summary(forgetful[0]) == summary(remembered[0])
    assert [f.files for f in forgetful[0]] == [f.files for f in remembered[0]]
    assert forgetful[1:] == remembered[1:]


@given(keys=tree_keys, layout=st.sampled_from(["auto", *LAYOUTS]))
# an orbax guess (`7/`) that a deeper number overturns: nothing of it is appended blindly
@example(keys={"7/_CHECKPOINT_METADATA", "7/12/_CHECKPOINT_METADATA", "7/12/x.bin"}, layout="auto")
@example(keys={"run/7/.metadata", "run/7/12/x.bin", "run/7/a.txt"}, layout="orbax")
def test_appending_what_is_gathered_without_add_reports_what_add_reports(
    keys: set[str], layout: str
) -> None:
    """An import's listing appends the objects of the checkpoint being gathered itself
    (`gathering`), calling `add` only for the keys outside it: the checkpoints, their
    files, the incomplete ones, the unrecognised count and, after every key, where a
    resumed listing must start (`open_from`) are those of a call of `add` per key."""
    ordered = sorted(k for k in keys if not any(o.startswith(k + "/") for o in keys))
    each: Recognizer[int] = Recognizer(layout)
    shortcut: Recognizer[int] = Recognizer(layout)
    by_add: list[Found[int] | Incomplete] = []
    by_shortcut: list[Found[int] | Incomplete] = []
    for key in ordered:
        by_add.extend(each.add(key, len(key)))
        gathering = shortcut.gathering()
        if gathering is not None and key.startswith(gathering[0]):
            gathering[2]((key[gathering[1] :], len(key)))
        else:
            by_shortcut.extend(shortcut.add(key, len(key)))
        assert shortcut.open_from == each.open_from
    by_add.extend(each.finish())
    by_shortcut.extend(shortcut.finish())
    assert by_shortcut == by_add
    assert shortcut.unrecognized == each.unrecognized


def test_a_lightning_file_among_an_orbax_steps_files_is_a_checkpoint_of_its_own() -> None:
    """An orbax `<N>/` is a guess its files join one by one (a directory that joined says
    the same of its next file); a file named like a Lightning checkpoint does not join it,
    even after files of the same directory did."""
    keys = ["run/7/_CHECKPOINT_METADATA", "run/7/a.bin", "run/7/b.bin"]
    keys += ["run/7/epoch=0-step=4.ckpt", "run/7/z.bin"]
    found, incomplete, unrecognized = recognise(keys)
    assert summary(found) == [
        ("orbax", "run/7", 7, "run"),
        ("lightning", "run/7/epoch=0-step=4.ckpt", 4, "run/7"),
    ]
    assert found[0].names == ("_CHECKPOINT_METADATA", "a.bin", "b.bin")
    assert incomplete == [] and unrecognized == 1  # z.bin: the listing has left run/7
