"""Task messages: their bounds, and how they are signed and checked (``macula.agent.tasks``).

A message is a JSON object ``{kind, task_id, from, to, sent_at, ..., proof}``; the proof
(``macula.agent.proof``) is bound to ``agent.<to>.task#<kind>:<task_id>:<sha256 of the
canonical body>`` (sorted keys, no spaces, UTF-8, the proof left out), so it cannot be replayed
to another peer, for another task, or with other content.

Invariants:
- ``verify_message`` never raises and lists every problem; a message it accepts was signed by
  ``sender`` (who must be its ``from``), is addressed to ``me``, carries no null and no boolean,
  and is within ``MAX_SKEW_MS`` of ``now_ms``.
- ``TaskLimits`` holds every bound of the task layer with its default; ``from_env`` reads
  ``MACULA_MCP_TASKS_<FIELD>`` (a positive integer) and names a bad one.
No I/O, no clock (``now_ms`` is an argument).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from macula.agent.envelope import bool_problems, is_id, is_node_hex
from macula.agent.proof import make_proof, verify_proof
from macula.config import positive_int_setting, task_limit_env
from macula.store.task_states import Task
from macula.store.task_values import TaskValue, value_bytes, value_problems
from macula.wire.identity import Identity

CALL_TIMEOUT_S: Final = 10.0
ASSIGNEE_STATES: Final = frozenset({"working", "input_required"})
_KINDS: Final = frozenset(
    {
        "task_sent",
        "task_input_given",
        "task_cancel_requested",
        "task_updated",
        "task_refused",
        "task_acked",
    }
)


@dataclass(frozen=True, slots=True)
class TaskLimits:
    """Every bound of the task layer; env ``MACULA_MCP_TASKS_<FIELD upper>`` overrides."""

    max_open_per_peer: int = 8
    max_title_chars: int = 280
    max_input_bytes: int = 16 * 1024
    max_result_bytes: int = 16 * 1024
    max_note_bytes: int = 2 * 1024
    retry_initial_ms: int = 1_000
    retry_max_ms: int = 30_000

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TaskLimits:
        defaults = cls()
        return cls(
            **{
                item.name: positive_int_setting(
                    env, task_limit_env(item.name), getattr(defaults, item.name)
                )
                for item in fields(cls)
            }
        )

    def problems(self, **texts: TaskValue | None) -> list[str]:
        """Every size and shape problem of the named values: title, error, note and reason
        are text; input and result text or a JSON value (``macula.store.task_values``)."""
        found: list[str] = []
        for name, value in texts.items():
            if value is None:
                continue
            if name == "title":
                if (
                    not isinstance(value, str)
                    or not value.strip()
                    or (len(value) > self.max_title_chars)
                ):
                    found.append(f"title: 1..{self.max_title_chars} characters, not blank")
                continue
            shape = value_problems(name, value) if name in ("input", "result") else []
            if name not in ("input", "result") and not isinstance(value, str):
                shape = [f"{name}: expected text"]
            if shape:
                found += shape
                continue
            limit = {
                "input": self.max_input_bytes,
                "result": self.max_result_bytes,
                "error": self.max_note_bytes,
                "note": self.max_note_bytes,
                "reason": self.max_note_bytes,
            }[name]
            if value_bytes(value) > limit:
                found.append(
                    f"{name}: longer than {limit} UTF-8 bytes; share big content by mesh_put"
                )
        return found


def task_endpoint(node_id: bytes) -> str:
    """The procedure every present agent serves for tasks: ``agent.<64 hex>.task``."""
    return f"agent.{node_id.hex()}.task"


def _canonical(body: Mapping[str, Any]) -> bytes:
    unsigned = {k: v for k, v in body.items() if k != "proof"}
    text = json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def message_procedure(to: bytes, body: Mapping[str, Any]) -> str:
    """What a message's proof is bound to: recipient, kind, task and the body's hash."""
    content = hashlib.sha256(_canonical(body)).hexdigest()
    return f"{task_endpoint(to)}#{body.get('kind')}:{body.get('task_id')}:{content}"


def sign_message(
    identity: Identity, to: bytes, body: Mapping[str, Any], now_ms: int
) -> dict[str, Any]:
    """``body`` addressed from ``identity`` to ``to`` at ``now_ms``, with its proof."""
    signed = {k: v for k, v in body.items() if v is not None and k != "proof"}
    signed |= {"from": identity.node_id.hex(), "to": to.hex(), "sent_at": now_ms}
    signed["proof"] = make_proof(identity, message_procedure(to, signed), now_ms)
    return signed


def verify_message(payload: object, me: bytes, sender: bytes, now_ms: int) -> list[str]:
    """Every problem with a message to ``me`` from ``sender`` (the attested caller, or the
    peer we called); empty means it is theirs, for us, unaltered and fresh. Never raises."""
    if not isinstance(payload, dict):
        return [f"message: expected an object, got {type(payload).__name__}"]
    problems = bool_problems(payload, "message")
    if payload.get("kind") not in _KINDS:
        problems.append("kind: unknown")
    if not is_id(payload.get("task_id")):
        problems.append("task_id: expected 1..64 characters of A-Z a-z 0-9 _ -")
    if not is_node_hex(payload.get("from")) or payload.get("from") != sender.hex():
        problems.append("from: not the attested sender")
    if payload.get("to") != me.hex():
        problems.append("to: addressed to another node")
    if type(payload.get("sent_at")) is not int:
        problems.append("sent_at: expected an integer")
    for key, value in payload.items():
        if value is None:
            problems.append(f"{key}: null is not allowed")
    if problems:
        return problems
    reason = verify_proof(payload.get("proof"), sender, message_procedure(me, payload), now_ms)
    return [] if reason is None else [f"proof: {reason}"]


def text_of(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    return value if isinstance(value, str) else None


REFUSAL_ACTION: Final = {
    "contact_refused": "the agent does not take tasks from you: ring it (mesh_ring) and ask "
    "to be trusted",
    "too_many_open": "wait for one of your tasks with it to end, then send again",
    "too_large": "shorten it; share big content by mesh_put and send its mcid",
    "already_terminal": "read the outcome with mesh_task_get",
    "illegal_transition": "mesh_task_get shows the state it is in",
    "not_found": "the assignee has no such task; check task_id",
}


def update_body(task: Task) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "task_updated",
        "task_id": task.task_id,
        "state": task.state,
        "state_seq": task.state_seq,
    }
    for name in ("note", "result", "error"):
        value = getattr(task, name)
        if value is not None:
            body[name] = value
    return body


def refused(task_id: str, code: str, reason: str, retryable: int) -> dict[str, Any]:
    return {
        "kind": "task_refused",
        "task_id": task_id,
        "code": code,
        "reason": reason[:2000],
        "retryable": retryable,
    }
