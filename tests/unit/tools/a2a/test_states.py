"""The one table between mesh task states and A2A's, both ways."""

from __future__ import annotations

import pytest
from a2a.types import TaskState

from macula.store.task_states import STATES
from tools.a2a.states import REFUSED_PREFIX, from_a2a, to_a2a


def test_every_mesh_state_has_an_a2a_state_and_comes_back() -> None:
    for state in STATES:
        if state == "pending_owner_approval":  # A2A has no such state: submitted, one way
            assert to_a2a(state) == TaskState.TASK_STATE_SUBMITTED
            continue
        assert from_a2a(to_a2a(state))[0] == state


def test_a_refused_send_is_rejected_and_comes_back_refused() -> None:
    assert to_a2a("failed", "refused: closed") == TaskState.TASK_STATE_REJECTED
    assert to_a2a("failed", "disk full") == TaskState.TASK_STATE_FAILED
    state, note = from_a2a(TaskState.TASK_STATE_REJECTED)
    assert state == "failed" and note is not None and note.startswith(REFUSED_PREFIX)


def test_every_a2a_state_but_unspecified_maps_and_unspecified_is_refused() -> None:
    for state in TaskState.values():
        if state == TaskState.TASK_STATE_UNSPECIFIED:
            with pytest.raises(ValueError):
                from_a2a(TaskState.TASK_STATE_UNSPECIFIED)
        else:
            assert from_a2a(state)[0] in STATES
    assert from_a2a(TaskState.TASK_STATE_AUTH_REQUIRED)[0] == "failed"
    with pytest.raises(ValueError):
        to_a2a("pending")
