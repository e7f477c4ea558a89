"""The action ledger: what sweeps and people ask of storage, one row per action.

Every change to storage is an Action row first; workers execute them (worker.py). This
package is the one owner of the SQL on actions: creating, listing and approving them
(actions.py), and a worker's claim, lease, steps, retries and ending (leases.py):
procrastinate's JobManager, in short.
"""

from app.services.lifecycle.ledger.actions import (
    add_action,
    approve_action,
    approve_sweep,
    cancel_open,
    count_by_kind_and_state,
    failed_purges,
    get_action,
    insert_actions,
    list_actions,
    new_action,
    open_action,
    planned_action,
    purge_action,
    release,
)
from app.services.lifecycle.ledger.leases import (
    LEASE,
    MAX_ATTEMPTS,
    add_retries,
    claim,
    close,
    finish,
    load,
    mark_step,
    renew,
    retry,
    set_step,
    wait_for_restore,
)

__all__ = [
    "LEASE",
    "MAX_ATTEMPTS",
    "add_action",
    "add_retries",
    "approve_action",
    "approve_sweep",
    "cancel_open",
    "claim",
    "close",
    "count_by_kind_and_state",
    "failed_purges",
    "finish",
    "get_action",
    "insert_actions",
    "list_actions",
    "load",
    "mark_step",
    "new_action",
    "open_action",
    "planned_action",
    "purge_action",
    "release",
    "renew",
    "retry",
    "set_step",
    "wait_for_restore",
]
