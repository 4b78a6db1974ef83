"""Outbound A2A: a mesh agent hands a task to an allowlisted A2A agent and follows it with the
same task tools (docs/a2a.md, "Outbound").

Invariants:
- The task is a ``requester`` row of the agent's own task store (peer ``links.marker(url)``);
  only this module changes it, through ``TaskStore.apply_remote`` (forward only, one outcome),
  and wakes ``Tasks.wait`` with ``Tasks.touched``. Nothing is ever queued in the mesh outbox for
  it, so the mesh never tries to deliver to the marker.
- Nothing is dialled before the allowlist (``tools.a2a.allowlist``) names the agent; every
  request is guarded (``tools.a2a.dial``). The allowlist is read at every send, input and cancel,
  so the owner's edits count at once: a removed agent is no longer dialled, even for its tasks.
- One follower per open task reads the agent's stream (or polls ``get`` with backoff when the
  stream ends early, the agent does not stream, or after a restart) and stops at a terminal
  state or ``input_required``. Changes are applied one at a time (a lock): ``state_seq`` rises
  by one per change the agent makes.
- A send, input or cancel returns once the agent's first answer is applied (at most
  ``FIRST_ANSWER_S``); a failure of that step is a ``TaskError`` carrying the task.
- An answer the agent refuses (it ended the task meanwhile: nothing follows a task while it
  is ``input_required``) reads the agent's state of the task, and that is its outcome here.
- A cancel before the agent named the task (its first answer is late) is remembered
  (``cancel_requested``): the follower sends it as soon as the agent names the task, and the
  task settles on the agent's answer (canceled here if it gives none in ``CANCEL_WAIT_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from macula.agent.task_messages import TaskLimits
from macula.store.task_states import SEND_SCOPE
from macula.store.task_values import TaskValue
from macula.store.tasks import TERMINAL, Task, TaskError, digest
from tools.a2a.allowlist import Agent, AllowlistError, load
from tools.a2a.links import FILE_NAME, Link, LinkStore, marker

if TYPE_CHECKING:
    from macula.agent.tasks import Tasks
    from tools.a2a.answers import Reading
    from tools.a2a.dial import Failure, Opened

log = logging.getLogger("macula.tools.a2a")

FIRST_ANSWER_S: Final = 10.0
CANCEL_WAIT_S: Final = 10.0
POLL_FIRST_S: Final = 0.25
POLL_MAX_S: Final = 5.0
UNREACHABLE_MAX_S: Final = 30.0
LOST_NOTE: Final = "lost: this server stopped before the A2A agent named the task"


class Outbound:
    """The A2A tasks of one agent: send, answer, cancel, follow."""

    def __init__(self, tasks: Tasks, links: LinkStore, home: Path) -> None:
        self.tasks = tasks
        self.store = tasks.store
        self.me = tasks.me
        self.links = links
        self.home = home
        self.urls: dict[bytes, str] = {}  # marker -> agent URL, for views
        self.followers: dict[str, asyncio.Task[None]] = {}
        self.cancels: dict[str, str | None] = {}  # cancels asked before the agent named the task
        self._apply = asyncio.Lock()

    @classmethod
    async def open(cls, tasks: Tasks, home: Path, *, create: bool) -> Outbound | None:
        """The agent's outbound A2A tasks (None: it never had any and ``create`` is 0);
        the followers of its open tasks start again."""
        path = Path(tasks.store.path).with_name(FILE_NAME)
        if not create and not path.exists():
            return None
        outbound = cls(tasks, await LinkStore.open(path), home)
        await outbound.resume()
        return outbound

    @property
    def limits(self) -> TaskLimits:
        return self.tasks.limits

    async def close(self) -> None:
        followers = list(self.followers.values())
        self.followers.clear()
        for follower in followers:
            follower.cancel()
        for follower in followers:
            with contextlib.suppress(BaseException):
                await follower
        await self.links.close()

    async def link(self, task_id: str) -> Link | None:
        return await self.links.get(self.me, task_id)

    # -- the three requests ---------------------------------------------------------------------

    async def send(self, to: str, title: str, input: TaskValue, *, key: str | None = None) -> Task:
        from a2a.types import Message, Part, Role, SendMessageRequest

        agent = self._allowed(to)
        key_digest = digest({"to": agent.url, "title": title, "input": input})
        if key is not None:
            first = await self.store.replay(self.me, SEND_SCOPE, key, key_digest)
            if first is not None:
                return first
        opened = await self._dial(agent)
        task_id = self.tasks.random(16).hex()
        peer = marker(agent.url)
        try:
            task = await self.store.create(
                self.me,
                Task.new(task_id, "requester", peer, title, input),
                self.tasks.clock(),
                max_open_per_peer=self.limits.max_open_per_peer,
                key=key,
                key_digest=key_digest,
            )
        except BaseException:
            await opened.close()
            raise
        await self.links.add(self.me, task_id, agent.url)
        self.urls[peer] = agent.url
        await self.tasks.touched()
        message = Message(message_id=task_id, role=Role.ROLE_USER, parts=[_part(Part, input)])
        message.metadata.update({"title": title})
        request = SendMessageRequest(message=message)
        return await self._start(task.task_id, opened, request, None)

    async def give_input(self, task_id: str, text: str, *, key: str | None = None) -> Task:
        from a2a.types import Message, Part, Role, SendMessageRequest

        key_digest = digest({"input": text})
        if key is not None:
            first = await self.store.replay(self.me, task_id, key, key_digest)
            if first is not None:
                return first
        task, link = await self._need(task_id)
        if task.state != "input_required" or link.a2a_task_id is None:
            raise TaskError(
                "already_terminal" if task.state in TERMINAL else "illegal_transition",
                f"task {task_id} is {task.state} (state_seq {task.state_seq}); input is taken "
                "only while it is input_required",
                "mesh_task_wait until it is input_required; mesh_task_get shows the outcome",
                task=task,
            )
        opened = await self._dial(self._allowed(link.url, task), task_id)
        message = Message(
            message_id=self.tasks.random(16).hex(),
            role=Role.ROLE_USER,
            task_id=link.a2a_task_id,
            context_id=link.context_id or "",
            parts=[Part(text=text)],
        )
        answered = await self._start(task_id, opened, SendMessageRequest(message=message), link)
        if key is not None:  # only once it reached the agent: a retry after a failure resends
            await self.store.set_flags(
                self.me, task_id, self.tasks.clock(), key=key, key_digest=key_digest
            )
        return answered

    async def cancel(self, task_id: str, reason: str | None, *, key: str | None = None) -> Task:
        key_digest = digest({"reason": reason})
        if key is not None:
            first = await self.store.replay(self.me, task_id, key, key_digest)
            if first is not None:
                return first
        task, link = await self._need(task_id)
        if task.state in TERMINAL:
            raise TaskError(
                "already_terminal",
                f"task {task_id} already has its outcome: {task.state} (state_seq "
                f"{task.state_seq}); a task has exactly one outcome",
                "read the outcome with mesh_task_get",
                task=task,
            )
        agent = self._allowed(link.url, task)
        if link.a2a_task_id is None and task_id in self.followers:
            # the agent has not named the task yet: its follower asks it to cancel once it does
            self.cancels[task_id] = reason
            await self.store.set_flags(
                self.me, task_id, self.tasks.clock(), cancel_requested=1, key=key,
                key_digest=key_digest,
            )  # fmt: skip
            return await self._need_task(task_id)
        if link.a2a_task_id is None:
            return await self._settle(task_id, "canceled", reason or "canceled before it started")
        done = await self._ask_cancel(agent, task_id, link.a2a_task_id, link.context_id)
        await self.store.set_flags(
            self.me, task_id, self.tasks.clock(), cancel_requested=1, key=key, key_digest=key_digest
        )
        done = await self._need_task(task_id)
        if done.state in TERMINAL:
            follower = self.followers.pop(task_id, None)
            if follower is not None:
                follower.cancel()
        return done

    async def _ask_cancel(
        self, agent: Agent, task_id: str, a2a_task_id: str, context_id: str | None
    ) -> Task:
        """Ask the agent to cancel its task; the task after its answer is applied (a refusal
        as a ``TaskError``, the agent's own state applied first when it says one)."""
        from a2a.types import CancelTaskRequest, GetTaskRequest

        from tools.a2a.answers import Reading
        from tools.a2a.dial import failure_of

        reading = Reading(self.limits, task_id=a2a_task_id, context_id=context_id)
        async with await self._dial(agent, task_id) as opened:
            try:
                reading.task(await opened.client.cancel_task(CancelTaskRequest(id=reading.task_id)))
            except Exception as exc:
                failure = failure_of(exc)
                if failure.code == "a2a_refused":  # not cancelable: it may have its outcome
                    with contextlib.suppress(Exception):
                        fresh = Reading(self.limits, task_id=reading.task_id)
                        fresh.task(await opened.client.get_task(GetTaskRequest(id=fresh.task_id)))
                        await self._applied(task_id, fresh)
                raise self._refusal(task_id, failure, await self._need_task(task_id)) from None
        return await self._applied(task_id, reading)

    async def _cancel_asked(self, task_id: str, url: str, reading: Reading) -> bool:
        """A cancel the model asked before the agent named the task, sent now that it has
        (at most ``CANCEL_WAIT_S``); whether the task has its outcome. An agent that does
        not answer the cancel leaves the task canceled here (the model asked for that)."""
        reason = self.cancels.pop(task_id, None)
        assert reading.task_id is not None
        try:
            agent = self._allowed(url)
            done = await asyncio.wait_for(
                self._ask_cancel(agent, task_id, reading.task_id, reading.context_id),
                CANCEL_WAIT_S,
            )
        except TaskError as exc:
            if exc.code == "a2a_refused":  # not cancelable: follow it to the outcome it has
                return (await self._need_task(task_id)).state in TERMINAL
            log.info("A2A task %s: the cancel asked early: %s", task_id, exc.detail)
            done = await self._settle(task_id, "canceled", reason or "canceled before it started")
        except TimeoutError:
            log.info("A2A task %s: the agent did not answer the cancel", task_id)
            done = await self._settle(task_id, "canceled", reason or "canceled before it started")
        return done.state in TERMINAL

    # -- following ------------------------------------------------------------------------------

    async def resume(self) -> None:
        """Start following every open task again (after a restart); forget links whose task
        the store pruned."""
        gone: list[str] = []
        for link in await self.links.all(self.me):
            task = await self.store.get(self.me, link.task_id)
            if task is None:
                gone.append(link.task_id)
                continue
            self.urls[task.peer] = link.url
            if task.state in TERMINAL or link.task_id in self.followers:
                continue
            if link.a2a_task_id is None:
                await self._settle(link.task_id, "failed", LOST_NOTE)
            elif task.state != "input_required":
                self._spawn(link.task_id, self._poll_again(link))
        await self.links.drop(self.me, gone)

    async def _start(self, task_id: str, opened: Opened, request: Any, link: Link | None) -> Task:
        """Follow the answers to ``request`` in the background; the task once the first one
        is applied (a failure of the first step raised with the task)."""
        from tools.a2a.answers import Reading

        reading = Reading(self.limits)
        if link is not None:
            reading.task_id, reading.context_id = link.a2a_task_id, link.context_id
        first: asyncio.Future[Failure | None] = asyncio.get_running_loop().create_future()
        answering = link is not None
        self._spawn(task_id, self._follow(task_id, opened, request, reading, first, answering))
        with contextlib.suppress(TimeoutError):
            failure = await asyncio.wait_for(asyncio.shield(first), FIRST_ANSWER_S)
            if failure is not None:
                raise self._refusal(task_id, failure, await self._need_task(task_id))
        return await self._need_task(task_id)

    def _spawn(self, task_id: str, work: Any) -> None:
        old = self.followers.pop(task_id, None)
        if old is not None:
            old.cancel()
        follower = asyncio.get_running_loop().create_task(work)
        self.followers[task_id] = follower
        follower.add_done_callback(lambda done: self._forget(task_id, done))

    def _forget(self, task_id: str, done: asyncio.Task[None]) -> None:
        if self.followers.get(task_id) is done:
            del self.followers[task_id]

    async def _follow(
        self,
        task_id: str,
        opened: Opened,
        request: Any,
        reading: Reading,
        first: asyncio.Future[Failure | None],
        answering: bool,
    ) -> None:
        """``answering``: ``request`` answers the task's question (it already has an A2A id)."""
        from tools.a2a.dial import failure_of

        heard = False
        try:
            async with opened:
                async for event in opened.client.send_message(request):
                    heard = True
                    reading.feed(event)
                    await self._applied(task_id, reading)
                    _resolve(first, None)
                    if _settled(reading):
                        return
                    if task_id in self.cancels and reading.task_id is not None:
                        link = await self.links.get(self.me, task_id)
                        if link is not None and await self._cancel_asked(
                            task_id, link.url, reading
                        ):
                            return
                _resolve(first, None)
                await self._poll(task_id, opened, reading)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failure = failure_of(exc)
            log.info("A2A task %s: %s", task_id, failure)
            if failure.code == "a2a_refused" and answering and not heard:
                # the agent took no answer: it may have ended the task meanwhile (its state
                # is the outcome, not a failure here)
                moved = await self._agents_state(task_id, reading)
                if moved is not None and moved.state != "input_required":
                    _resolve(first, failure)
                    return
            if failure.code == "a2a_unreachable" and answering and not heard:
                _resolve(first, failure)  # the answer never left: the task still waits for it
                return
            if failure.code == "a2a_unreachable" and heard and reading.task_id is not None:
                _resolve(first, None)  # named and accepted: the agent may come back
                link = await self.links.get(self.me, task_id)
                if link is not None:
                    await self._poll_again(link)
                return
            await self._settle(task_id, "failed", f"{failure.code}: {failure.detail}")
            _resolve(first, failure)

    async def _agents_state(self, task_id: str, reading: Reading) -> Task | None:
        """The task after the agent's own state of it (``get``) is applied; None if the agent
        could not say."""
        from a2a.types import GetTaskRequest

        from tools.a2a.answers import Reading
        from tools.a2a.dial import dial

        link = await self.links.get(self.me, task_id)
        if link is None or reading.task_id is None:
            return None
        fresh = Reading(self.limits, task_id=reading.task_id, context_id=reading.context_id)
        try:
            async with await dial(self._allowed(link.url)) as opened:
                fresh.task(await opened.client.get_task(GetTaskRequest(id=reading.task_id)))
            return await self._applied(task_id, fresh)
        except Exception as exc:
            log.info("A2A task %s: the agent did not say its state: %s", task_id, exc)
            return None

    async def _poll_again(self, link: Link) -> None:
        """Follow a task by ``get`` alone (after a restart, or the agent was away), dialling
        again with backoff while it is unreachable."""
        from tools.a2a.answers import Reading
        from tools.a2a.dial import dial, failure_of

        delay = POLL_FIRST_S
        while True:
            reading = Reading(self.limits, task_id=link.a2a_task_id, context_id=link.context_id)
            try:
                agent = self._allowed(link.url)
            except TaskError as exc:  # the owner took it off the allowlist, or it is malformed
                await self._settle(link.task_id, "failed", f"{exc.code}: {exc.detail}")
                return
            try:
                async with await dial(agent) as opened:
                    await self._poll(link.task_id, opened, reading)
                    return
            except Exception as exc:
                failure = failure_of(exc)
                if failure.code != "a2a_unreachable":
                    await self._settle(link.task_id, "failed", f"{failure.code}: {failure.detail}")
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, UNREACHABLE_MAX_S)

    async def _poll(self, task_id: str, opened: Opened, reading: Reading) -> None:
        from a2a.types import GetTaskRequest

        delay = POLL_FIRST_S
        while not _settled(reading) and reading.task_id is not None:
            reading.task(await opened.client.get_task(GetTaskRequest(id=reading.task_id)))
            await self._applied(task_id, reading)
            if _settled(reading):
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)

    # -- applying -------------------------------------------------------------------------------

    async def _applied(self, task_id: str, reading: Reading) -> Task:
        """The task after the state ``reading`` holds is applied (a no-op if nothing moved)."""
        link = await self.links.get(self.me, task_id)
        if link is not None and reading.task_id and link.a2a_task_id != reading.task_id:
            await self.links.bind(self.me, task_id, reading.task_id, reading.context_id or "")
        change = reading.change()
        return await self._write(task_id, change.fields())

    async def _settle(self, task_id: str, state: str, note: str) -> Task:
        from tools.a2a.answers import bounded

        note = bounded(note, self.limits.max_note_bytes)
        error = note if state == "failed" else None
        return await self._write(task_id, {"state": state, "note": note, "error": error})

    async def _write(self, task_id: str, fields: dict[str, Any]) -> Task:
        async with self._apply:
            task = await self._need_task(task_id)
            moved = (fields["state"], fields.get("note")) != (task.state, task.note)
            if task.state in TERMINAL or (not moved and task.delivered):
                return task
            seq = task.state_seq + 1 if moved else task.state_seq
            changed, _ = await self.store.apply_remote(
                self.me, task.peer, task_id, fields | {"state_seq": seq}, self.tasks.clock()
            )
        await self.tasks.touched()
        return changed or task

    # -- helpers --------------------------------------------------------------------------------

    def _allowed(self, to: str, task: Task | None = None) -> Agent:
        """The allowlisted agent ``to`` names; a ``TaskError`` (with ``task``) if none."""
        try:
            allowlist = load(self.home)
        except AllowlistError as exc:
            raise TaskError(
                "a2a_allowlist_invalid",
                f"{exc}; no A2A agent is dialled until it is fixed",
                "ask the owner to fix owner.toml (table [a2a])",
                task=task,
            ) from None
        agent = allowlist.find(to)
        if agent is None:
            raise TaskError(
                "a2a_not_allowlisted",
                f"{to[:200]} is not in the owner's A2A agents ([a2a] agents in "
                f"{allowlist.path}); nothing else is dialled",
                "ask the owner to add it (macula-mcp a2a-agent add URL), or use a listed one",
                task=task,
            )
        return agent

    async def _dial(self, agent: Agent, task_id: str | None = None) -> Opened:
        """An SDK client to ``agent``; a failure is a ``TaskError`` (with the task, if named)."""
        from tools.a2a.dial import Failure, dial

        try:
            return await dial(agent)
        except Failure as failure:
            task = None if task_id is None else await self._need_task(task_id)
            raise self._refusal(task_id, failure, task) from None

    def _refusal(self, task_id: str | None, failure: Failure, task: Task | None) -> TaskError:
        from tools.a2a.dial import NEXT_ACTION

        what = f"task {task_id}: " if task_id else ""
        return TaskError(
            failure.code,
            what + failure.detail,
            NEXT_ACTION.get(failure.code, "read detail"),
            retryable=failure.retryable,
            task=task,
        )

    async def _need(self, task_id: str) -> tuple[Task, Link]:
        task, link = await self._need_task(task_id), await self.link(task_id)
        if link is None or task.role != "requester":
            raise TaskError(
                "not_found",
                f"no A2A task {task_id} that you sent",
                "check task_id (mesh_task_list)",
            )
        return task, link

    async def _need_task(self, task_id: str) -> Task:
        task = await self.store.get(self.me, task_id)
        if task is None:
            raise TaskError("not_found", f"no task {task_id}", "check task_id (mesh_task_list)")
        return task


def _part(part_type: Callable[..., Any], value: TaskValue) -> Any:
    """A task's input as one A2A part: text as text, a JSON value as a data part."""
    if isinstance(value, str):
        return part_type(text=value)
    from google.protobuf.json_format import ParseDict
    from google.protobuf.struct_pb2 import Value

    return part_type(data=ParseDict(value, Value()), media_type="application/json")


def _settled(reading: Reading) -> bool:
    from a2a.types import TaskState

    return reading.reply is not None or reading.state in (
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
        TaskState.TASK_STATE_INPUT_REQUIRED,
        TaskState.TASK_STATE_AUTH_REQUIRED,
    )


def _resolve(first: asyncio.Future[Failure | None], value: Failure | None) -> None:
    if not first.done():
        first.set_result(value)


async def outbound_of(runtime: Any, *, create: bool = False) -> Outbound | None:
    """``runtime``'s outbound A2A tasks, opened on first need (None: none ever, and not
    ``create``). Opening resumes the followers of open tasks."""
    if runtime.a2a is None:
        from macula.config import macula_home

        opened = await Outbound.open(runtime.agent.tasks, macula_home(runtime.env), create=create)
        if opened is not None and runtime.a2a is not None:  # another call opened it meanwhile
            await opened.close()
        elif opened is not None:
            runtime.a2a = opened
    outbound: Outbound | None = runtime.a2a
    return outbound
