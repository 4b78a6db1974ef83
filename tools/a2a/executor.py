"""The door's ``AgentExecutor``: an A2A task is a mesh task, followed until it stops or asks.

- A new A2A task: the client's requester (``tools.a2a.requesters``) hands the agent a mesh task
  (title ``A2A from <client>: ...``, the message's value as input); the A2A task (its id the
  SDK's) carries the mesh task id in ``metadata.mesh_task_id``.
- A message naming a task that is ``input-required``: its text is the answer
  (``Tasks.give_input``), and the mesh task works again. If the mesh task ended meanwhile
  (the agent finished without the answer, or it was canceled), the answer gets that outcome.
- While an A2A task waits at ``input-required`` a watcher (one per task, at most
  ``WATCH_WAIT_S``) follows the mesh task: an outcome the agent settles on without the answer
  is written to the SDK's task store, so ``GetTask`` says it and a later answer is refused as
  for any finished task. The watcher stops when the client answers and when the door closes.
- Then every change of the requester's copy (``Tasks.wait``, by ``state_seq``) becomes one A2A
  event, in order: a status update (its message: the agent's note, question or error), and
  for ``completed`` first an artifact holding the result. ``execute`` returns at the one
  outcome or at ``input-required`` (the SDK parks the task until the next message).
- A refusal by the agent (its contact policy, its bounds) is the mesh's ``failed`` with a
  ``refused:`` note: A2A ``rejected`` (``tools.a2a.states``).
- ``cancel`` asks the agent to cancel (as ``mesh_task_cancel``) and reports the outcome the
  mesh settles on, waiting at most ``CANCEL_WAIT_S``: an agent that finished first keeps its
  outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from a2a.helpers.proto_helpers import new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskManager, TaskStore
from a2a.types import (
    Artifact,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError
from google.protobuf.struct_pb2 import Struct

from macula.agent.task_messages import TaskLimits
from macula.agent.tasks import Tasks
from macula.store.tasks import TERMINAL, TaskError
from macula.store.tasks import Task as MeshTask
from tools.a2a.parts import message_value, title_for, value_part
from tools.a2a.states import to_a2a

FOLLOW_WAIT_S: Final = 300.0
WATCH_WAIT_S: Final = 3_600.0
CANCEL_WAIT_S: Final = 10.0
MESH_ID: Final = "mesh_task_id"

log = logging.getLogger("macula.a2a")


def mesh_id_of(task: Task) -> str:
    value = task.metadata.fields.get(MESH_ID)
    if value is None or not value.string_value:
        raise TaskNotCancelableError(message="this task has no mesh task")
    return str(value.string_value)


class MeshExecutor(AgentExecutor):
    """Executes the A2A tasks of one agent (node ``agent``) as mesh tasks."""

    def __init__(
        self,
        agent: bytes,
        requester: Callable[[str], Awaitable[tuple[Tasks, str]]],
        limits: Callable[[], TaskLimits],
        store: TaskStore | None = None,
    ) -> None:
        self.agent = agent
        self.store = store  # the SDK's task store, where a watcher writes a late outcome
        self.watchers: dict[str, asyncio.Task[None]] = {}  # by A2A task id
        # the requester of the client whose node id (hex) is the call's user, and its name
        self.requester = requester
        self.limits = limits

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        assert context.message is not None and context.call_context is not None
        self._unwatch(context.task_id)
        tasks, client = await self.requester(context.call_context.user.user_name)
        current = context.current_task
        if current is None:
            value = message_value(context.message, self.limits())
            try:
                sent = await tasks.send(self.agent, title_for(client, value, self.limits()), value)
            except TaskError as exc:
                if exc.task is None:
                    raise InvalidParamsError(message=exc.detail) from exc
                sent = exc.task
            metadata = Struct()
            metadata.update({MESH_ID: sent.task_id, "agent_node_id": self.agent.hex()})
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=context.context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message],
                    metadata=metadata,
                )
            )
            seen = sent.state_seq if sent.state == "submitted" else 0
            await self._follow(tasks, sent.task_id, seen, context, event_queue)
            return
        mesh_id = mesh_id_of(current)
        answer = message_value(context.message, self.limits(), answer=True)
        before = (await tasks.get(mesh_id)).state_seq
        try:
            await tasks.give_input(mesh_id, str(answer))
        except TaskError as exc:
            if exc.task is None:
                raise InvalidParamsError(message=exc.detail) from exc
            if exc.task.state in TERMINAL:  # it ended without the answer: that is the outcome
                await self._emit(exc.task, context, event_queue)
                return
        await self._follow(tasks, mesh_id, before, context, event_queue, answer=str(answer))

    async def _follow(
        self,
        tasks: Tasks,
        mesh_id: str,
        seen: int,
        context: RequestContext,
        queue: EventQueue,
        *,
        answer: str | None = None,
    ) -> None:
        while True:
            task = await tasks.get(mesh_id)
            if task.state_seq > seen:
                seen = task.state_seq
                # the mesh's working-again carries the client's own answer as its note
                ours = task.state == "working" and task.note == answer
                await self._emit(task, context, queue, quiet=ours)
                if task.state == "input_required":
                    self._watch(tasks, mesh_id, seen, context)
                if task.state in TERMINAL or task.state == "input_required":
                    return
            await tasks.wait(mesh_id, FOLLOW_WAIT_S, after_state_seq=seen)

    def _watch(self, tasks: Tasks, mesh_id: str, seen: int, context: RequestContext) -> None:
        """Follow a task parked at input-required until it ends (then write its outcome to
        the SDK's store), the client answers, or ``WATCH_WAIT_S`` passes."""
        assert context.task_id is not None
        if self.store is None:
            return
        self._unwatch(context.task_id)
        watcher = asyncio.create_task(self._watched(tasks, mesh_id, seen, context))
        self.watchers[context.task_id] = watcher
        watcher.add_done_callback(
            lambda done: (
                self.watchers.pop(context.task_id or "", None)
                if self.watchers.get(context.task_id or "") is done
                else None
            )
        )

    def _unwatch(self, task_id: str) -> None:
        watcher = self.watchers.pop(task_id, None)
        if watcher is not None:
            watcher.cancel()

    async def _watched(
        self, tasks: Tasks, mesh_id: str, seen: int, context: RequestContext
    ) -> None:
        assert self.store is not None and context.call_context is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WATCH_WAIT_S
        try:
            while (left := deadline - loop.time()) > 0:
                waited = await tasks.wait(mesh_id, left, after_state_seq=seen)
                task = waited.task
                if task is None or task.state_seq <= seen:
                    continue
                seen = task.state_seq
                if task.state in TERMINAL:
                    manager = TaskManager(
                        self.store, context.call_context, context.task_id, context.context_id, None
                    )
                    for event in self._events(task, context):
                        await manager.save_task_event(event)
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the requester closed, the store refused: GetTask stays
            log.info("A2A task %s: stopped watching: %s", context.task_id, exc)

    async def close(self) -> None:
        """Stop every watcher (the door closes)."""
        watchers = list(self.watchers.values())
        self.watchers.clear()
        for watcher in watchers:
            watcher.cancel()
        for watcher in watchers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher

    async def _emit(
        self, task: MeshTask, context: RequestContext, queue: EventQueue, *, quiet: bool = False
    ) -> None:
        for event in self._events(task, context, quiet=quiet):
            await queue.enqueue_event(event)

    def _events(
        self, task: MeshTask, context: RequestContext, *, quiet: bool = False
    ) -> list[TaskArtifactUpdateEvent | TaskStatusUpdateEvent]:
        """The A2A events that say a mesh task's state: its result first, then its status."""
        assert context.task_id is not None and context.context_id is not None
        task_id, context_id = context.task_id, context.context_id
        events: list[TaskArtifactUpdateEvent | TaskStatusUpdateEvent] = []
        if task.state == "completed" and task.result is not None:
            artifact = Artifact(artifact_id=f"{task.task_id}-result", name="result")
            artifact.parts.append(value_part(task.result))
            events.append(
                TaskArtifactUpdateEvent(
                    task_id=task_id, context_id=context_id, artifact=artifact, last_chunk=True
                )
            )
        said = task.error if task.state == "failed" and task.error else task.note
        # a refusal's "refused: ..." is the requester's error (macula.agent.task_outbox)
        status = TaskStatus(state=to_a2a(task.state, said))  # type: ignore[arg-type]
        if said and not quiet:
            status.message.CopyFrom(new_text_message(said, context_id=context_id, task_id=task_id))
        status.timestamp.FromMilliseconds(task.updated_ms)
        events.append(TaskStatusUpdateEvent(task_id=task_id, context_id=context_id, status=status))
        return events

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.current_task is not None and context.call_context is not None
        tasks, _ = await self.requester(context.call_context.user.user_name)
        mesh_id = mesh_id_of(context.current_task)
        with_outcome = None
        try:
            with_outcome = await tasks.cancel(mesh_id, "canceled by its A2A client")
        except TaskError as exc:
            if exc.task is None:
                raise TaskNotCancelableError(message=exc.detail) from exc
            with_outcome = exc.task
        deadline = asyncio.get_running_loop().time() + CANCEL_WAIT_S
        while with_outcome.state not in TERMINAL:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break  # the agent is away: the cancel is queued, the A2A task says canceled
            waited = await tasks.wait(mesh_id, left, after_state_seq=with_outcome.state_seq)
            with_outcome = waited.task or with_outcome
        if with_outcome.state in TERMINAL:
            await self._emit(with_outcome, context, event_queue)
