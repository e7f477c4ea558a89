"""How a tree of objects nobody catalogued says which of them are checkpoints (DESIGN
section 14): the layouts the training frameworks write, told apart by the name of a
checkpoint's directory (or file) and by the files a complete one holds.

Pure and streaming: a `Recognizer` is fed the tree's keys (relative to the import's root)
in sorted order, the order every store lists in, and says what each checkpoint is as soon
as the listing has moved past it. A checkpoint's objects share its key and a `/` as a
prefix, so they are contiguous in that order, and memory holds one checkpoint at a time
whatever the size of the tree.

Which directory is the checkpoint: the shallowest segment with a layout's name
(`checkpoint-<N>`, `step-<N>`, `iter_<N>`, `global_step<N>`, `step_<N>`), so that the
DeepSpeed `global_step<N>/` a Trainer writes inside its `checkpoint-<N>/` stays part of
it; then a Lightning file (`*step=<N>*.ckpt`; `last.ckpt` is an alias); failing those, the
deepest segment that is a bare number (orbax's `<N>/`), so that a date or a job id above
the steps (`runs/2024/5/`) is not taken for one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")

LAYOUTS = ("hf", "lightning", "dcp", "orbax", "megatron", "deepspeed", "generic")
AUTO = "auto"
CONTAINERS = frozenset(
    {"checkpoints", "checkpoint", "ckpt", "ckpts", "output", "outputs", "models"}
)
NAME_LIMIT = 63  # the name pattern: ^[a-z0-9][a-z0-9._-]{0,62}$
UNRECOGNIZED_SAMPLE = 100  # unrecognised keys a dry run lists
SEGMENT_MEMO = 65_536  # directory names a recognizer remembers what they say (then forgets)

# Directory names, by the layout they say ("step-<N>" is dcp's when it holds `.metadata`,
# generic's otherwise).
_NAMED: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("hf", re.compile(r"checkpoint-(\d+)")),
    ("dcp", re.compile(r"step-(\d+)")),
    ("megatron", re.compile(r"iter_(\d{7})")),
    ("deepspeed", re.compile(r"global_step(\d+)")),
    ("generic", re.compile(r"step_(\d+)")),
)
_NUMBER = re.compile(r"\d+")
_ORBAX_TMP = re.compile(r"\d+\.orbax-checkpoint-tmp-.*")
_LIGHTNING = re.compile(r"(?:.*[^0-9])?step=(\d+)(?:[^0-9].*)?\.ckpt")
_MARKERS = {
    "hf": ("trainer_state.json",),
    "dcp": (".metadata",),
    "orbax": ("_CHECKPOINT_METADATA", "commit_success.txt"),
}
_MISSING = {
    "hf": "no trainer_state.json",
    "dcp": "no .metadata",
    "orbax": "no _CHECKPOINT_METADATA or commit_success.txt",
}


_Place = tuple[str, int, int]  # layout, depth of the checkpoint's segment, step


@dataclass(frozen=True, slots=True)
class Found(Generic[T]):
    """One checkpoint of the tree. `key` is its directory (or, `single_file`, its file)
    relative to the root; `run_path` the segments above it, which its run is named from;
    `files` its objects relative to `key` (a single file: its own name), sorted, each with
    what the listing said of it (`add`'s `info`: a size, a time, checksums)."""

    layout: str
    key: str
    step: int
    run_path: str
    single_file: bool
    files: tuple[tuple[str, T], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.files)


@dataclass(frozen=True, slots=True)
class Incomplete:
    """A checkpoint that is reported and never registered, and why."""

    key: str
    reason: str


class Candidate(NamedTuple):
    """A checkpoint found in the tree, ready to register. A tuple: an import pickles a
    hundred thousand of them from its listing process to the one registering them."""

    key: str  # relative to the import's uri: how it is reported
    run: str  # the run's name, normalised
    run_uri: str  # where that name came from: the new run's label `import_path`
    step: int
    uri: str
    layout: str
    # the manifest's entries as JSON, encoded where the tree was listed: a hundred thousand
    # manifests of ten entries each took the listing process 0.8 s to pickle as
    # dictionaries (and the writer 0.4 s to unpickle), against 0.3 s encoded and pickled
    files: bytes
    size_bytes: int
    created_at: datetime
    metrics: dict[str, float]
    single_file: bool


@dataclass(slots=True)
class _Group(Generic[T]):
    layout: str  # as the directory's name says (dcp may still turn generic)
    key: str
    step: int
    files: list[tuple[str, T]] = field(default_factory=list)
    inside: str = ""  # `key/`: what every key of its objects starts with
    cut: int = 0  # its length: where an object's name in the checkpoint starts
    # whether every key under `inside` is the checkpoint's (an orbax `<N>/` is a guess
    # that a deeper number may overturn)
    settled: bool = True
    joined: str | None = None  # the last directory found to belong to an unsettled guess

    def __post_init__(self) -> None:
        self.inside = self.key + "/"
        self.cut = len(self.inside)
        self.settled = self.layout != "orbax"


def normalise(name: str) -> str:
    """`name` under the name pattern: lower-cased, every character outside `a-z0-9._-`
    replaced by `-`, leading punctuation dropped, at most NAME_LIMIT characters; `run`
    when nothing is left."""
    lowered = re.sub(r"[^a-z0-9._-]", "-", name.lower())
    return lowered.lstrip("._-")[:NAME_LIMIT] or "run"


def run_segment(run_path: str) -> int | None:
    """Which segment of `run_path` names the run of a checkpoint found below it: the
    nearest that is not a container name (`checkpoints`, `outputs`, ...); None when there
    is none (the import root's own name is the run's)."""
    segments = run_path.split("/") if run_path else []
    return next(
        (i for i in reversed(range(len(segments))) if segments[i].lower() not in CONTAINERS),
        None,
    )


def run_name(run_path: str, root_name: str) -> tuple[str, str]:
    """The run of a checkpoint found below `run_path` (see run_segment), named after that
    segment or the import root's last one. Returns the name normalised, and the segment
    it came from."""
    at = run_segment(run_path)
    original = root_name if at is None else run_path.split("/")[at]
    return normalise(original), original


class Recognizer(Generic[T]):
    """Feed it the tree's keys in sorted order (`add`, each with what the listing said of
    the object, carried into `Found.files`), then call `finish`: each yields
    what it settled, `Found` checkpoints and `Incomplete` ones. `unrecognized` counts the
    objects that belong to no checkpoint. `layout` is one of LAYOUTS, or `auto` (each
    directory by its own name)."""

    def __init__(self, layout: str = AUTO, *, keep_unrecognized: int = 0) -> None:
        if layout != AUTO and layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; one of auto, {', '.join(LAYOUTS)}")
        self.layout = layout
        self.unrecognized = 0
        # the first `keep_unrecognized` of those keys (the caller may drain it as it goes)
        self.unrecognized_keys: list[str] = []
        self._keep = keep_unrecognized
        self._group: _Group[T] | None = None
        self._skipping: str | None = None  # an orbax temporary directory, reported once
        self._open_from: str | None = None  # the first key of what is still being gathered
        self._directory: str | None = None  # the last object's directory, and what it says
        self._directory_says: tuple[_Place | None, _Place | None] = (None, None)
        self._segments: dict[str, _SegmentSays] = {}  # what each directory name says

    @property
    def open_from(self) -> str | None:
        """The first key of the checkpoint still being gathered (or skipped), None when
        every key added so far is settled: what a resumed listing must start before."""
        return self._open_from

    def gathering(self) -> tuple[str, int, Callable[[tuple[str, T]], object]] | None:
        """The checkpoint being gathered, when every key under its directory is its own
        (not an orbax `<N>/`, which a deeper number may overturn): that directory's key
        with a `/`, its length, and the append of its objects. For each key that starts
        with it, `add` only appends `(key[length:], info)`, settles nothing and opens
        nothing: a caller feeding a million keys may do that itself, without a call per
        key, until its next `add` (or `finish`) replaces the checkpoint."""
        group = self._group
        if group is None or not group.settled:
            return None
        return group.inside, group.cut, group.files.append

    def add(self, key: str, info: T) -> Sequence[Found[T] | Incomplete]:
        """What adding `key` settled: usually nothing, returned as such rather than as a
        generator, because this runs once per object of trees of millions."""
        group = self._group
        # Inside the checkpoint being gathered: the common case, one prefix test. A bare
        # number is a guess, though: a deeper one (`runs/2024/5/`, after a file of
        # `runs/2024/`) is the checkpoint instead.
        if group is not None and key.startswith(group.inside):
            if group.settled:
                group.files.append((key[group.cut :], info))
                return ()
            # A directory that joined the guess says the same of its next file, unless
            # that file is named like a Lightning checkpoint.
            directory = key.rpartition("/")[0]
            if directory == group.joined and not key.endswith(".ckpt"):
                group.files.append((key[group.cut :], info))
                return ()
            segments = key.split("/")
            where = self._locate(key, segments)
            if where is not None and "/".join(segments[: where[1] + 1]) == group.key:
                group.files.append((key[group.cut :], info))
                group.joined = directory
                return ()
        if self._skipping is not None and key.startswith(self._skipping + "/"):
            return ()
        settled = self.finish()
        segments = key.split("/")
        where = self._locate(key, segments)
        if where is None:
            self._unrecognized([key])
            return settled
        layout, depth, step = where
        prefix = "/".join(segments[: depth + 1])
        if layout == "orbax-tmp":  # reported once the listing has left it
            self._skipping, self._open_from = prefix, key
        elif layout == "lightning":
            run_path = "/".join(segments[:-1])
            found = Found("lightning", key, step, run_path, True, ((segments[-1], info),))
            return (*settled, found)
        else:
            self._group = _Group(layout, prefix, step, [(key[len(prefix) + 1 :], info)])
            self._open_from = key
        return settled

    def finish(self) -> Sequence[Found[T] | Incomplete]:
        """Settle the checkpoint being gathered, if any (the listing ended, or moved on)."""
        group, self._group = self._group, None
        skipped, self._skipping = self._skipping, None
        self._open_from = None
        if group is None and skipped is None:
            return ()
        settled: list[Found[T] | Incomplete] = []
        if skipped is not None:
            reason = "an orbax save that never finished (a temporary directory)"
            settled.append(Incomplete(skipped, reason))
        if group is None:
            return settled
        layout = group.layout
        markers = _MARKERS.get(layout)
        if markers is not None and not {name for name, _ in group.files}.intersection(markers):
            if layout == "dcp" and self.layout == AUTO:
                layout = "generic"  # a step-<N>/ without .metadata
            elif layout == "orbax" and self.layout == AUTO:
                # a numbered folder, nothing more
                self._unrecognized([f"{group.key}/{name}" for name, _ in group.files])
                return settled
            else:
                settled.append(Incomplete(group.key, _MISSING[layout]))
                return settled
        run_path = group.key.rpartition("/")[0]
        # in order already: the keys came sorted, and share the checkpoint's prefix
        files = tuple(group.files)
        settled.append(Found(layout, group.key, group.step, run_path, False, files))
        return settled

    def _unrecognized(self, keys: list[str]) -> None:
        self.unrecognized += len(keys)
        room = self._keep - len(self.unrecognized_keys)
        if room > 0:
            self.unrecognized_keys.extend(keys[:room])

    def _locate(self, key: str, segments: list[str]) -> _Place | None:
        """(layout, depth of the checkpoint's segment, step) for an object, or None. What
        the directories say is worked out once per directory: its files come together."""
        directory = key.rpartition("/")[0]
        if directory != self._directory:
            self._directory = directory
            self._directory_says = self._read_directories(segments[:-1])
        named, number = self._directory_says
        if named is not None:
            return named
        name = segments[-1]
        if self.layout in (AUTO, "lightning") and name != "last.ckpt":
            found = _LIGHTNING.fullmatch(name)
            if found is not None:
                return "lightning", len(segments) - 1, int(found.group(1))
        return number

    def _read_directories(self, directories: list[str]) -> tuple[_Place | None, _Place | None]:
        """The shallowest directory named like a layout's checkpoint (or an orbax
        temporary one), and the deepest bare number (orbax's `<N>/`)."""
        named: _Place | None = None
        number: _Place | None = None
        memo = self._segments
        for depth, segment in enumerate(directories):
            says = memo.get(segment)
            if says is None:
                if len(memo) >= SEGMENT_MEMO:
                    memo.clear()
                says = memo[segment] = _segment_says(segment, self.layout)
            layout, step, numeral = says
            if named is None and layout is not None:
                named = (layout, depth, step)
            if numeral is not None:
                number = ("orbax", depth, numeral)
        return named, number


# What one directory's name says under a wanted layout: the layout it names (or
# "orbax-tmp") and its step, and its value when it is a bare number (orbax's `<N>/`).
_SegmentSays = tuple[str | None, int, int | None]


def _segment_says(segment: str, wanted: str) -> _SegmentSays:
    """Worked out once per name: the same few names (a team's, a run's, `checkpoints`,
    `checkpoint-<N>`) head every object of a tree, and matching each against every
    layout's pattern again for every directory of a million-object tree was a third of
    an import's recognizing."""
    orbax = wanted in (AUTO, "orbax")
    numeral = int(segment) if orbax and _NUMBER.fullmatch(segment) else None
    if orbax and _ORBAX_TMP.fullmatch(segment):
        return "orbax-tmp", 0, numeral
    for layout, pattern in _NAMED:
        found = pattern.fullmatch(segment)
        if found is None:
            continue
        if wanted in (AUTO, layout):
            return layout, int(found.group(1)), numeral
        if wanted == "generic" and layout == "dcp":  # step-<N>/ is generic's too
            return "generic", int(found.group(1)), numeral
        break  # named for a layout not wanted
    return None, 0, numeral


def hf_metrics(trainer_state: Mapping[str, Any], step: int) -> dict[str, float]:
    """A Trainer checkpoint's metrics from its `trainer_state.json`: the last value of each
    `eval_*` key logged at or before `step` (later entries of a resumed run's history do
    not count), numbers only."""
    metrics: dict[str, float] = {}
    history = trainer_state.get("log_history")
    if not isinstance(history, list):
        return metrics
    for entry in history:
        if not isinstance(entry, Mapping):
            continue
        at = entry.get("step")
        if not isinstance(at, int) or at > step:
            continue
        for name, value in entry.items():
            if not str(name).startswith("eval_") or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                metrics[str(name)] = float(value)
    return metrics
