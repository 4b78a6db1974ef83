"""What an A2A agent answers, read into a mesh task's state (pure: no I/O, no clock).

The agent's answers are untrusted input, as a mesh peer's are:
- only text reaches the task: text parts as given, data parts as JSON text; a file part (raw
  bytes or a URL) is never fetched, opened or written: one line says it was left out;
- control characters other than newline and tab are dropped; the result is cut to
  ``TaskLimits.max_result_bytes`` and a note or error to ``max_note_bytes`` (UTF-8), the cut
  said at the end;
- an update for another A2A task, or with no state, is ``Malformed``: the task fails, once; so
  is a task or context id past ``MAX_ID_CHARS`` or with a control character (the ids are
  stored with the task and sent back to the agent).
States map through ``tools.a2a.states`` (the one table).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from a2a.types import Artifact, Message, Part, StreamResponse, Task, TaskState, TaskStatus
from google.protobuf.json_format import MessageToDict

from macula.agent.task_messages import TaskLimits
from tools.a2a.states import from_a2a

MAX_ARTIFACTS: Final = 64
MAX_ID_CHARS: Final = 256
CUT: Final = " [cut: {} more bytes]"
_KEEP: Final = frozenset("\n\t")


class Malformed(ValueError):
    """An answer no A2A agent in good order sends."""


@dataclass(frozen=True, slots=True)
class Change:
    """The requester's copy of the task as the A2A agent's answers leave it."""

    state: str
    note: str | None = None
    result: str | None = None
    error: str | None = None

    def fields(self) -> dict[str, str | None]:
        return {"state": self.state, "note": self.note, "result": self.result, "error": self.error}


def bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes (marker included), on a character boundary."""
    clean = "".join(c for c in text if c in _KEEP or (ord(c) >= 0x20 and c != "\x7f"))
    data = clean.encode("utf-8", "replace")
    if len(data) <= limit:
        return clean
    room = max(0, limit - len(CUT.format(len(data)).encode()))
    kept = data[:room].decode("utf-8", "ignore")
    return kept + CUT.format(len(data) - len(kept.encode("utf-8")))


def part_text(part: Part) -> str:
    kind = part.WhichOneof("content")
    if kind == "text":
        return part.text
    if kind == "data":
        return json.dumps(MessageToDict(part.data), ensure_ascii=False, sort_keys=True)
    what = part.media_type or "file"
    name = f" {part.filename!r}" if part.filename else ""
    return f"[a {what} part{name} was left out: macula never fetches or stores A2A files]"


def parts_text(parts: Iterable[Part]) -> str:
    return "\n".join(part_text(p) for p in parts)


def message_text(message: Message) -> str:
    return parts_text(message.parts)


def _check_id(what: str, value: str) -> None:
    if len(value) > MAX_ID_CHARS:
        raise Malformed(f"a {what} id of {len(value)} characters (at most {MAX_ID_CHARS})")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
        raise Malformed(f"a {what} id with a control character")


@dataclass
class Reading:
    """One A2A task followed through its answers: ``feed`` each, ``change`` reads the state."""

    limits: TaskLimits = field(default_factory=TaskLimits)
    task_id: str | None = None  # the A2A task's id, once an answer named it
    context_id: str | None = None
    state: int | None = None
    status_text: str | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    reply: str | None = None  # a direct Message answer (no task): it is the result

    def feed(self, event: StreamResponse) -> None:
        kind = event.WhichOneof("payload")
        if kind == "task":
            self.task(event.task)
        elif kind == "message":
            self.reply = message_text(event.message)
            self.state = TaskState.TASK_STATE_COMPLETED
        elif kind == "status_update":
            self._name(event.status_update.task_id, event.status_update.context_id)
            self._status(event.status_update.status)
        elif kind == "artifact_update":
            update = event.artifact_update
            self._name(update.task_id, update.context_id)
            self._artifact(update.artifact, append=update.append)
        else:
            raise Malformed("an answer with neither task, message, status nor artifact")

    def task(self, task: Task) -> None:
        self._name(task.id, task.context_id)
        if task.artifacts:
            self.artifacts = {}
            for artifact in task.artifacts:
                self._artifact(artifact, append=False)
        self._status(task.status)

    def change(self) -> Change:
        if self.state is None:
            raise Malformed("no state in the A2A agent's answer")
        try:
            state, implied = from_a2a(self.state)
        except ValueError:
            raise Malformed(f"state {self.state} is not an A2A task state") from None
        limits = self.limits
        said = None if not self.status_text else bounded(self.status_text, limits.max_note_bytes)
        if state == "completed":
            body = self.reply if self.reply is not None else self._artifacts_text()
            body = body if body else (self.status_text or "")
            return Change(state, said, result=bounded(body, limits.max_result_bytes))
        if state == "failed":
            error = implied or said or "the A2A agent failed the task (it said no more)"
            if implied and said:
                error = bounded(f"{implied}: {said}", limits.max_note_bytes)
            return Change(state, implied or said, error=error)
        if state == "input_required" and not said:
            said = "the A2A agent asks for input (it said no more)"
        return Change(state, implied or said)

    def _name(self, task_id: str, context_id: str) -> None:
        if not task_id:
            raise Malformed("an update that names no task")
        _check_id("task", task_id)
        _check_id("context", context_id)
        if self.task_id is not None and task_id != self.task_id:
            raise Malformed(f"an update for another A2A task ({task_id[:64]!r})")
        self.task_id = task_id
        if context_id:
            self.context_id = context_id

    def _status(self, status: TaskStatus) -> None:
        if status.state == TaskState.TASK_STATE_UNSPECIFIED:
            raise Malformed("a task status with no state")
        self.state = status.state
        self.status_text = message_text(status.message) if status.HasField("message") else None

    def _artifact(self, artifact: Artifact, *, append: bool) -> None:
        key = artifact.artifact_id or str(len(self.artifacts))
        before = self.artifacts.get(key, "") if append else ""
        # what is kept is bounded whatever the agent streams: the result is cut anyway
        self.artifacts[key] = (before + parts_text(artifact.parts))[
            : self.limits.max_result_bytes + 1
        ]
        if len(self.artifacts) > MAX_ARTIFACTS:  # a flood of artifacts: the oldest go
            del self.artifacts[next(iter(self.artifacts))]

    def _artifacts_text(self) -> str:
        return "\n\n".join(self.artifacts.values())
