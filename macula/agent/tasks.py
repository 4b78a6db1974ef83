"""Tasks: work handed from one agent (the requester) to another (the assignee), one outcome each.

Transport: every agent present serves ``agent.<node_id>.task`` (plain Node RPC in the zero
realm, so it works wherever the mesh routes a call). Every message and every reply is a JSON
object signed by its sender: a proof (``macula.agent.proof``) bound to
``agent.<to>.task#<kind>:<task_id>:<sha256 of the canonical body>``, so it cannot be replayed
for another peer, task or content, and its ``from`` must be the call's attested caller.

Invariants:
- The assignee's copy is the authority on state: only it changes state (the requester's input
  and cancel are requests it applies), and the requester's copy follows its ``state_seq``
  forward only. A refused send ends the requester's copy as ``failed`` (``refused: ...``).
- Every mutation commits together with its idempotency key and the message it owes the peer
  (the outbox), in one SQLite transaction; the outbox is delivered in order per peer, retried
  with backoff (``TaskLimits.retry_*``), at once when the node reconnects or the peer speaks.
  Receivers are idempotent (task ids, per-message keys, ``state_seq``), so a retry never has
  a second effect. On ``serve`` the assignee re-announces the state of its open tasks.
  The delivery itself is ``macula.agent.task_outbox``.
- Who may hand us a task is the contact policy's decision, as for rings: accepted and
  deferred (``ask``: the model judges it, ``contact`` 3) are taken, declined is refused.
- With the owner's ``tasks_from_strangers`` 1 (``macula.agent.approvals``), a task from a
  sender outside the allowlist that the policy would take is held in the approval queue, not
  in the task store (the model never sees it): the sender's copy becomes
  ``pending_owner_approval`` (``state_seq`` 2). Approved, the task is created ``submitted``
  at ``state_seq`` 3 and reaches the model like any other; denied or expired, the sender's
  copy ends ``failed`` (``refused: ...``, ``state_seq`` 3). A retried send hears the same.
- Bounds (``TaskLimits``, env ``MACULA_MCP_TASKS_*``): open tasks per peer on each side, and
  the sizes of title, input, result/error and note; past them a clear ``TaskError``.
- ``wait`` never misses a change: it reads a change counter before reading the store, and
  wakes on any change committed after that read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from macula.agent.approvals import Approvals
from macula.agent.audit import NO_TRAIL, Recorder, outside_fact
from macula.agent.contact_policy import Answer, PolicyState, decide
from macula.agent.envelope import is_id
from macula.agent.held_tasks import HeldTasks
from macula.agent.task_messages import (
    ASSIGNEE_STATES,
    REFUSAL_ACTION,
    TaskLimits,
    refused,
    sign_message,
    task_endpoint,
    text_of,
    update_body,
    verify_message,
)
from macula.agent.task_outbox import Refusal, TaskOutbox
from macula.node.node import Node
from macula.node.serving import CallRefused, IncomingCall
from macula.store.task_states import PENDING_OWNER
from macula.store.task_values import TaskValue, value_of
from macula.store.tasks import (
    OPEN_STATES,
    TERMINAL,
    Role,
    Task,
    TaskError,
    TaskStore,
    digest,
)
from macula.wire.identity import ZERO_REALM

log = logging.getLogger("macula.agent.tasks")


@dataclass(frozen=True, slots=True)
class Waited:
    task: Task | None
    changed: int  # 1: the task changed (or needed you) within the wait; 0: timed out


class Tasks:
    def __init__(
        self,
        node: Node,
        store: TaskStore,
        clock: Callable[[], int],
        *,
        policy: Callable[[], PolicyState],
        limits: TaskLimits | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
        approvals: Approvals | None = None,
    ) -> None:
        self.node = node
        self.approvals = approvals
        self.held: HeldTasks | None = None
        self.store = store
        self.clock = clock
        self.policy = policy
        self.limits = limits or TaskLimits()
        # told (sender, task_id, title) of each task newly handed to us; they must not block
        self.observers: list[Callable[[bytes, str, str], None]] = []
        self.random = random_bytes
        self.me = node.identity.node_id
        self.serving = False
        self.audit: Recorder = NO_TRAIL  # the agent's trail (set by Agent)
        self.stats: dict[str, int] = {}
        self._changes = asyncio.Condition()
        self._version = 0
        self._outbox = TaskOutbox(node, store, clock, self.limits, self._changed, self._count)
        self._pump: asyncio.Task[None] | None = None
        self._listening = False
        if approvals is not None:
            self.held = HeldTasks(self, approvals)

    # -- lifecycle ------------------------------------------------------------------------------

    async def serve(self, group: asyncio.TaskGroup) -> None:
        """Serve ``agent.<me>.task``, re-announce our open assigned tasks, start the outbox."""
        await self.node.advertise(ZERO_REALM, task_endpoint(self.me), self._handle)
        self.serving = True
        if not self._listening:  # a reconnect makes every queued message due at once
            self.node.on_state(self._state_changed)
            self._listening = True
        now = self.clock()
        for task in await self.store.list_tasks(
            self.me, role="assignee", open_only=1, limit=10_000
        ):
            await self.store.enqueue(self.me, task.peer, task.task_id, update_body(task), now)
        if self._pump is None:
            self._pump = group.create_task(self._outbox.run())
        self._outbox.kick.set()

    async def unserve(self) -> None:
        await self.node.unadvertise(ZERO_REALM, task_endpoint(self.me))
        self.serving = False

    async def stop(self) -> None:
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    def _state_changed(self, state: str) -> None:
        if state in ("connected", "reconnected"):
            self._outbox.retry_all = True
            self._outbox.kick.set()

    # -- requester ------------------------------------------------------------------------------

    async def send(
        self, to: bytes, title: str, input: TaskValue, *, key: str | None = None
    ) -> Task:
        """Hand ``to`` a task; the task as it stands once the first delivery attempt ended
        (``delivered`` 0: queued, retried in the background). A refusal is a ``TaskError``."""
        if to == self.me:
            raise TaskError(
                "invalid_argument", "to: you cannot hand a task to yourself", "name another agent"
            )
        self._check(title=title, input=input)
        task_id = self.random(16).hex()
        task = Task.new(task_id, "requester", to, title, input)
        body = {"kind": "task_sent", "task_id": task_id, "title": title, "input": input}
        stored = await self.store.create(
            self.me,
            task,
            self.clock(),
            max_open_per_peer=self.limits.max_open_per_peer,
            key=key,
            key_digest=digest({"to": to.hex(), "title": title, "input": input}),
            outbox=body,
        )
        await self._changed()
        if stored.replayed:
            return stored
        return await self._refusal_or(stored.task_id, await self._outbox.flush_peer(to))

    async def give_input(self, task_id: str, input: str, *, key: str | None = None) -> Task:
        """Answer an assignee's question (the task is ``input_required``); it resumes work."""
        self._check(input=input)
        key_digest = digest({"input": input})
        first = await self._replayed(task_id, key, key_digest)
        if first is not None:
            return first
        task = await self._need(task_id, "requester")
        if task.state != "input_required":
            raise TaskError(
                "already_terminal" if task.state in TERMINAL else "illegal_transition",
                f"task {task_id} is {task.state} (state_seq {task.state_seq}); input is taken "
                "only while it is input_required",
                "mesh_task_wait until it is input_required; mesh_task_get shows the outcome",
                task=task,
            )
        body = {
            "kind": "task_input_given",
            "task_id": task_id,
            "input": input,
            "key": self._message_key(key),
        }
        await self.store.set_flags(
            self.me, task_id, self.clock(), key=key, key_digest=key_digest, outbox=body
        )
        return await self._refusal_or(task_id, await self._outbox.flush_peer(task.peer))

    async def cancel(
        self, task_id: str, reason: str | None = None, *, key: str | None = None
    ) -> Task:
        """Ask the assignee to cancel; ``cancel_requested`` 1 until it answers (queued when it
        is away). ``already_terminal`` names the outcome if the task already has one."""
        self._check(reason=reason)
        key_digest = digest({"reason": reason})
        first = await self._replayed(task_id, key, key_digest)
        if first is not None:
            return first
        task = await self._need(task_id, "requester")
        if task.state in TERMINAL:
            raise TaskError(
                "already_terminal",
                f"task {task_id} already has its outcome: {task.state} (state_seq "
                f"{task.state_seq}); a task has exactly one outcome",
                "read the outcome with mesh_task_get",
                task=task,
            )
        body = {
            "kind": "task_cancel_requested",
            "task_id": task_id,
            "reason": reason,
            "key": self._message_key(key),
        }
        await self.store.set_flags(
            self.me,
            task_id,
            self.clock(),
            cancel_requested=1,
            key=key,
            key_digest=key_digest,
            outbox=body,
        )
        await self._changed()
        return await self._refusal_or(task_id, await self._outbox.flush_peer(task.peer))

    async def _replayed(self, task_id: str, key: str | None, key_digest: str) -> Task | None:
        if key is None:
            return None
        return await self.store.replay(self.me, task_id, key, key_digest)

    def _message_key(self, key: str | None) -> str:
        """The id the assignee dedupes a request by: from the caller's key, else random."""
        if key is None:
            return self.random(16).hex()
        return hashlib.sha256(self.me + key.encode("utf-8", "surrogatepass")).hexdigest()[:32]

    # -- assignee -------------------------------------------------------------------------------

    async def update(
        self, task_id: str, state: str, note: str | None = None, *, key: str | None = None
    ) -> Task:
        """Report progress: ``working`` or ``input_required`` (a question in ``note``)."""
        if state not in ASSIGNEE_STATES:
            raise TaskError(
                "invalid_argument",
                f"state: expected working or input_required, not {state!r} (finish with "
                "mesh_task_complete)",
                "call again with working or input_required",
            )
        if state == "input_required" and not (note or "").strip():
            raise TaskError(
                "invalid_argument",
                "note: input_required needs your question",
                "put the question in note",
            )
        self._check(note=note)
        return await self._assignee_change(task_id, state, key, note=note)

    async def complete(
        self,
        task_id: str,
        *,
        result: TaskValue | None = None,
        error: str | None = None,
        key: str | None = None,
    ) -> Task:
        """The one outcome: ``result`` (completed) or ``error`` (failed), exactly one of them."""
        if (result is None) == (error is None):
            raise TaskError(
                "invalid_argument",
                "give exactly one of result or error",
                "result for completed work, error to fail or decline it",
            )
        self._check(result=result, error=error)
        state = "completed" if result is not None else "failed"
        return await self._assignee_change(task_id, state, key, result=result, error=error)

    async def _assignee_change(
        self,
        task_id: str,
        state: str,
        key: str | None,
        *,
        note: str | None = None,
        result: TaskValue | None = None,
        error: str | None = None,
    ) -> Task:
        changed = await self.store.transition(
            self.me,
            task_id,
            state,
            self.clock(),
            by="assignee",
            role="assignee",
            note=note,
            result=result,
            error=error,
            key=key,
            key_digest=digest({"state": state, "note": note, "result": result, "error": error}),
            outbox=update_body,
        )
        await self._changed()
        # the outbox delivers it: a tool call never waits for an absent peer
        self._outbox.kick.set()
        return changed

    # -- reading and waiting --------------------------------------------------------------------

    async def get(self, task_id: str) -> Task:
        return await self._need(task_id, None)

    async def list_tasks(
        self,
        *,
        role: Role | None = None,
        state: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Task]:
        return await self.store.list_tasks(
            self.me, role=role, state=state, limit=limit, offset=offset
        )

    async def count_tasks(self, *, role: Role | None = None, state: str | None = None) -> int:
        return await self.store.count_tasks(self.me, role=role, state=state)

    async def wait(
        self,
        task_id: str | None,
        wait_seconds: float,
        after_state_seq: int | None = None,
        *,
        started: Callable[[], Awaitable[None]] | None = None,
    ) -> Waited:
        """Until the task's ``state_seq`` passes ``after_state_seq`` (at once if it has).
        Without it: at once if the task is terminal or waits on you (input_required for the
        requester, submitted for the assignee), else the next change. Without ``task_id``:
        the oldest task handed to you still ``submitted``, or the next one to arrive."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait_seconds)
        first = True
        while True:
            async with self._changes:
                seen = self._version
            task, ready = await self._ready(task_id, after_state_seq, first)
            if ready:
                return Waited(task, 1)
            if first and started is not None:
                await started()
            if task_id is not None and after_state_seq is None:
                after_state_seq = task.state_seq if task is not None else None
            first = False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return Waited(task, 0)
            async with self._changes:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changes.wait_for(functools.partial(self._newer_than, seen)), remaining
                    )

    async def _ready(
        self, task_id: str | None, after: int | None, first: bool
    ) -> tuple[Task | None, bool]:
        if task_id is None:
            waiting = await self.store.list_tasks(
                self.me, role="assignee", state="submitted", limit=10_000
            )
            return (waiting[-1], True) if waiting else (None, False)
        task = await self._need(task_id, None)
        if after is not None:
            return task, task.state_seq > after
        needs_you = (task.role == "requester" and task.state == "input_required") or (
            task.role == "assignee" and task.state == "submitted"
        )
        return task, first and (task.state in TERMINAL or needs_you)

    async def touched(self) -> None:
        """Wake every ``wait``: a task changed in the store by a writer outside this class
        (a task handed to an A2A agent, ``tools.a2a.outbound``)."""
        await self._changed()

    def _newer_than(self, seen: int) -> bool:
        return self._version > seen

    async def _changed(self) -> None:
        async with self._changes:
            self._version += 1
            self._changes.notify_all()

    # -- the endpoint ---------------------------------------------------------------------------

    async def _handle(self, call: IncomingCall) -> dict[str, Any]:
        problems = verify_message(call.payload, self.me, call.caller, self.clock())
        if problems:
            self._count("messages_unverified")
            raise CallRefused("unverified task message: " + "; ".join(problems))
        body: dict[str, Any] = call.payload
        await self._peer_spoke(call.caller)
        kind = body["kind"]
        if kind == "task_sent":
            reply = await self._task_received(call.caller, body)
            self._audit_task(call.caller, body, reply)
        elif kind in ("task_input_given", "task_cancel_requested"):
            reply = await self._request_received(call.caller, body)
        elif kind == "task_updated":
            reply = await self._update_received(call.caller, body)
        else:
            raise CallRefused(f"{kind} is a reply, not a request")
        return sign_message(self.node.identity, call.caller, reply, self.clock())

    def _audit_task(self, sender: bytes, body: dict[str, Any], reply: dict[str, Any]) -> None:
        """The trail's ``task_received``: accepted, queued or refused (with the code), the content
        (title and input) as a digest only."""
        refused_code = reply.get("code") if reply.get("kind") == "task_refused" else None
        task_id = body.get("task_id")
        facts: dict[str, str | int] = {"sender": sender.hex()}
        facts |= outside_fact(self.audit, "task_id", task_id, is_id(task_id))
        if refused_code:
            facts["code"] = str(refused_code)[:64]
        content = {"title": body.get("title"), "input": body.get("input")}
        outcome = "refused" if refused_code else "accepted"
        if reply.get("state") == PENDING_OWNER:
            outcome = "queued"  # held for the owner (macula.agent.held_tasks)
        self.audit.record("task_received", outcome,
                          content_digest=self.audit.digest(content), **facts)  # fmt: skip

    async def _task_received(self, sender: bytes, body: dict[str, Any]) -> dict[str, Any]:
        task_id = body["task_id"]
        held = await self.store.get(self.me, task_id)
        if held is not None and held.role == "assignee" and held.peer == sender:
            return update_body(held)  # a retried send: what we hold, no second task
        title, text = text_of(body, "title"), value_of(body, "input")
        if title is None or text is None:
            return refused(task_id, "invalid_argument", "title: text; input: text or JSON", 0)
        too_big = self.limits.problems(title=title, input=text)
        if too_big:
            return refused(task_id, "too_large", "; ".join(too_big), 0)
        decision = decide(self.policy(), sender)
        if decision.answer == Answer.DECLINED:
            self._count("tasks_refused_by_policy")
            return refused(task_id, "contact_refused", decision.reason or "declined", 0)
        contact = int(decision.answer)
        policy = self.policy()
        if (
            self.held is not None
            and self.approvals is not None
            and not policy.allows(sender)
            and self.approvals.settings().tasks_from_strangers
        ):
            assert self.held is not None
            return await self.held.hold(sender, task_id, {"title": title, "input": text}, contact)
        task = Task.new(task_id, "assignee", sender, title, text, contact=contact, delivered=1)
        try:
            stored = await self.store.create(
                self.me, task, self.clock(), max_open_per_peer=self.limits.max_open_per_peer
            )
        except TaskError as exc:
            return refused(task_id, exc.code, exc.detail, int(exc.retryable))
        await self.arrived(sender, task_id, title)
        return update_body(stored)

    async def arrived(self, sender: bytes, task_id: str, title: str) -> None:
        await self._changed()
        for observer in list(self.observers):
            try:
                observer(sender, task_id, title)
            except Exception:  # an observer failing costs nothing here
                log.exception("a task observer failed")

    async def _request_received(self, sender: bytes, body: dict[str, Any]) -> dict[str, Any]:
        task_id, kind = body["task_id"], body["kind"]
        task = await self.store.get(self.me, task_id)
        if task is None and kind == "task_cancel_requested" and self.held is not None:
            withdrawn = await self.held.canceled(sender, task_id)
            if withdrawn is not None:
                return withdrawn
        if task is None or task.role != "assignee" or task.peer != sender:
            return refused(task_id, "not_found", "no such task from you here", 0)
        key = text_of(body, "key")
        if key is None or not is_id(key):
            return refused(task_id, "invalid_argument", "key: expected an id", 0)
        note: str | None
        if kind == "task_input_given":
            text = text_of(body, "input") or ""
            if self.limits.problems(input=text) or not text:
                return refused(task_id, "too_large", "input empty or too large", 0)
            state, note = "working", text
        else:
            state, note = "canceled", text_of(body, "reason")
        try:
            changed = await self.store.transition(
                self.me,
                task_id,
                state,
                self.clock(),
                by="requester",
                role="assignee",
                note=note,
                key=f"{kind}:{key}",
                key_digest=digest({"note": note}),
            )
        except TaskError as exc:  # its outcome or state is in the reply: the requester learns
            return update_body(exc.task or task) | {"refused_code": exc.code}
        await self._changed()
        return update_body(changed)

    async def _update_received(self, sender: bytes, body: dict[str, Any]) -> dict[str, Any]:
        task_id = body["task_id"]
        state, seq = body.get("state"), body.get("state_seq")
        if state not in OPEN_STATES | TERMINAL or type(seq) is not int or seq < 1:
            return {"kind": "task_acked", "task_id": task_id, "known": 0}
        problems = self.limits.problems(
            note=text_of(body, "note"), result=body.get("result"), error=text_of(body, "error")
        )
        if problems:
            return {"kind": "task_acked", "task_id": task_id, "known": 0}
        task, applied = await self.store.apply_remote(self.me, sender, task_id, body, self.clock())
        if applied:
            await self._changed()
        return {
            "kind": "task_acked",
            "task_id": task_id,
            "known": int(task is not None),
            "state_seq": task.state_seq if task else 0,
        }

    async def _refusal_or(self, task_id: str, refusals: dict[str, Refusal]) -> Task:
        task = await self._need(task_id, None)
        refusal = refusals.get(task_id)
        if refusal is None:
            return task
        raise TaskError(
            refusal.code,
            f"task {task_id}: {refusal.detail} (it is {task.state}, state_seq {task.state_seq})",
            REFUSAL_ACTION.get(refusal.code, "read detail; mesh_task_get shows the task"),
            retryable=bool(refusal.retryable),
            task=task,
        )

    async def _peer_spoke(self, peer: bytes) -> None:
        """A verified message from ``peer``: it is back (and maybe we reconnected), so what
        we owe anyone goes now instead of at its backoff time."""
        if await self.store.pending_outbox(self.me):
            await self.store.retry_now(self.me, self.clock())
            self._outbox.kick.set()

    # -- helpers --------------------------------------------------------------------------------

    def _check(self, **texts: TaskValue | None) -> None:
        problems = self.limits.problems(**texts)
        if problems:
            raise TaskError(
                "too_large" if any("longer" in p for p in problems) else "invalid_argument",
                "; ".join(problems),
                "shorten it (share big content by mesh_put and send its mcid)",
            )

    async def _need(self, task_id: str, role: Role | None) -> Task:
        task = await self.store.get(self.me, task_id)
        if task is None or (role is not None and task.role != role):
            whose = "" if role is None else f" that you sent (you are not its {role})"
            raise TaskError(
                "not_found", f"no task {task_id}{whose}", "check task_id with mesh_task_list"
            )
        return task

    def count(self, name: str) -> None:
        self._count(name)

    def kick_outbox(self) -> None:
        self._outbox.kick.set()

    def _count(self, name: str) -> None:
        self.stats[name] = self.stats.get(name, 0) + 1
