"""The crash points themselves: every step of the executor has one right after it (read from
the executor's source, so a new step without one fails here), each declared name is placed
exactly once, and `crash_point` kills its process where and when asked."""

from __future__ import annotations

import ast
import inspect
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.lifecycle import steps, trash, worker
from app.services.lifecycle.crash import (
    CRASH_AT_ENV,
    CRASH_TRACE_ENV,
    POINTS,
    UndeclaredCrashPoint,
    crash_point,
)
from app.services.lifecycle.ledger import leases
from app.storage.base import Storage

# Storage calls that only read; every other method of the protocol changes something.
STORAGE_READS = {
    "same_service",
    "list_prefix",
    "prefix_exists",
    "head",
    "open_read",
    "read_small",
    "restore_state",
}
STORAGE_CHANGES = {
    name
    for name, member in vars(Storage).items()
    if callable(member) and not name.startswith("_") and name not in STORAGE_READS
}
# The transfer helpers the executor calls: two write, one reads the copy back; and the one
# way it removes a location's bytes.
TRANSFER_CALLS = {"copy_files", "change_class", "verify_files", "remove_location"}
# Ledger and step functions that are one transaction each: their callers carry the point.
STEP_CALLS = {"claim", "set_step", "switch", "finish", "retry", "wait_for_restore"}
# Transactions that change no outcome: renewing a lease (a worker that dies after it loses
# the lease anyway), and tallying an execution's storage retries (bookkeeping after the step).
LEASE_ONLY = {"renew", "record_retries", "add_retries"}
# Calls that write in a transaction (an assignment to an attribute of a row writes too).
WRITES = {"add", "delete", "merge", "update", "insert", "close", "add_active"}


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            return func.id
    return None


def _statement_call(statement: ast.stmt) -> ast.Call | None:
    """The call a statement makes: `f(...)`, `x = f(...)` or `x = f(...).attr`."""
    value: ast.expr | None = None
    if isinstance(statement, ast.Expr | ast.Assign | ast.AnnAssign):
        value = statement.value
    if isinstance(value, ast.Attribute):
        value = value.value
    return value if isinstance(value, ast.Call) else None


def _writes(block: ast.With) -> bool:
    """Whether a transaction changes anything: reads need no crash point after them."""
    for node in ast.walk(block):
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) for t in targets):
                return True
        if _called(node) in WRITES:
            return True
    return False


def _is_point(statement: ast.stmt) -> bool:
    return _called(statement.value) == "crash_point" if isinstance(statement, ast.Expr) else False


def _is_guard(statement: ast.stmt) -> bool:
    """`if <nothing to do>: return ...`, which may stand between a claim and its point."""
    return (
        isinstance(statement, ast.If)
        and not statement.orelse
        and all(isinstance(s, ast.Return) for s in statement.body)
    )


def _blocks(node: ast.AST, function: str = "") -> Iterator[tuple[str, list[ast.stmt]]]:
    """Every list of statements, with the name of the function it belongs to."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        function = node.name
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield function, block
    for child in ast.iter_child_nodes(node):
        yield from _blocks(child, function)


def steps_without_a_point(source: str) -> list[str]:
    """Each storage call that changes something, step commit or writing transaction of
    `source` not followed by a crash point (skipping `if ...: return` guards), nor carrying
    one as a callback."""
    missing = []
    for function, block in _blocks(ast.parse(source)):
        for index, statement in enumerate(block):
            call = _statement_call(statement)
            needs = call is not None and _called(call) in (
                STORAGE_CHANGES | TRANSFER_CALLS | STEP_CALLS
            )
            if isinstance(statement, ast.With) and function not in STEP_CALLS | LEASE_ONLY:
                needs |= _writes(statement) and any(
                    _called(i.context_expr) == "session_scope" for i in statement.items
                )
            if not needs:
                continue
            if call is not None and any(
                _called(node) == "crash_point" for kw in call.keywords for node in ast.walk(kw)
            ):
                continue
            following = block[index + 1 :]
            while following and _is_guard(following[0]):
                following = following[1:]
            if not following or not _is_point(following[0]):
                first_line = ast.unparse(statement).splitlines()[0]
                missing.append(f"{function}, line {statement.lineno}: {first_line}")
    return missing


def placed_points(source: str) -> list[str]:
    return [
        str(node.args[0].value)
        for node in ast.walk(ast.parse(source))
        if _called(node) == "crash_point"
        and isinstance(node, ast.Call)
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]


# A worker's code: its loop, a transfer's steps, the trash's, and its side of the ledger.
EXECUTOR_SOURCE = "\n".join(inspect.getsource(m) for m in (worker, steps, trash, leases))


def test_every_step_of_the_executor_is_followed_by_a_crash_point() -> None:
    assert steps_without_a_point(EXECUTOR_SOURCE) == []


def test_the_check_finds_a_step_without_a_point() -> None:
    """The check above is not vacuous: drop any one point and it names the step before it."""
    lines = EXECUTOR_SOURCE.splitlines(keepends=True)
    point_lines = [i for i, line in enumerate(lines) if line.strip().startswith("crash_point(")]
    assert len(point_lines) >= 15
    for i in point_lines:
        mutated = "".join(lines[:i] + lines[i + 1 :])
        assert steps_without_a_point(mutated), f"dropping line {i + 1} went unnoticed"


def test_the_storage_protocol_is_split_into_reads_and_changes() -> None:
    members = {n for n, m in vars(Storage).items() if callable(m) and not n.startswith("_")}
    assert members >= STORAGE_READS, "a read was renamed: update STORAGE_READS"
    assert {"delete_prefix", "abort_uploads", "request_restore", "upload"} <= STORAGE_CHANGES
    for name in STEP_CALLS | LEASE_ONLY:
        assert f"def {name}(" in EXECUTOR_SOURCE, f"{name} is gone: update the lists above"


def test_each_declared_point_is_placed_once_and_only_declared_points_are() -> None:
    placed = placed_points(EXECUTOR_SOURCE)
    assert len(POINTS) == len(set(POINTS))
    assert sorted(placed) == sorted(POINTS)


def test_a_point_is_a_no_op_without_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CRASH_AT_ENV, raising=False)
    monkeypatch.delenv(CRASH_TRACE_ENV, raising=False)
    crash_point("worker.claimed")
    crash_point("no.such.point")  # not even checked: nothing is asked of the points


def test_an_undeclared_point_is_refused_when_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CRASH_TRACE_ENV, str(tmp_path / "trace"))
    with pytest.raises(UndeclaredCrashPoint, match=r"no\.such\.point"):
        crash_point("no.such.point")


REACH_TWICE = textwrap.dedent(
    """
    from app.services.lifecycle.crash import crash_point
    crash_point("worker.claimed")
    crash_point("transfer.started")
    crash_point("worker.claimed")
    print("survived", flush=True)
    """
)


@pytest.mark.parametrize(
    ("crash_at", "trace"),
    [
        ("worker.claimed", ["worker.claimed#1"]),
        ("worker.claimed#2", ["worker.claimed#1", "transfer.started#1", "worker.claimed#2"]),
        ("transfer.started#2", None),  # never reached a second time: the process lives
    ],
)
def test_the_process_kills_itself_at_the_nth_arrival(
    tmp_path: Path, crash_at: str, trace: list[str] | None
) -> None:
    trace_file = tmp_path / "trace"
    env = {**os.environ, CRASH_AT_ENV: crash_at, CRASH_TRACE_ENV: str(trace_file)}

    done = subprocess.run(
        [sys.executable, "-c", REACH_TWICE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).parents[2],
    )

    if trace is None:
        assert done.returncode == 0, done.stderr
        assert done.stdout == "survived\n"
        assert trace_file.read_text().split() == [
            "worker.claimed#1",
            "transfer.started#1",
            "worker.claimed#2",
        ]
        return
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout == ""
    assert trace_file.read_text().split() == trace
