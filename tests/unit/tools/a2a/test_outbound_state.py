"""What an A2A agent's answers do to the stored task (a real SQLite task store): one
``state_seq`` per change it makes, repeats ignored, exactly one outcome, waiters woken, and the
link kept so a restart resumes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from a2a.helpers.proto_helpers import new_text_artifact, new_text_message
from a2a.types import (
    Role,
    StreamResponse,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)

from macula.agent.task_messages import TaskLimits
from macula.store.tasks import Task, TaskStore
from tools.a2a.answers import Reading
from tools.a2a.links import FILE_NAME, LinkStore, marker
from tools.a2a.outbound import LOST_NOTE, Outbound

pytestmark = pytest.mark.anyio

ME = bytes(range(32))
URL = "http://127.0.0.1:9/"


class Tasks:
    """What ``Outbound`` uses of ``macula.agent.tasks.Tasks``: its store, identity, bounds,
    clock and the wake-up of waiters (counted here)."""

    def __init__(self, store: TaskStore) -> None:
        self.store, self.me, self.limits = store, ME, TaskLimits()
        self.now, self.woken = 1_000, 0

    def clock(self) -> int:
        self.now += 1
        return self.now

    def random(self, n: int) -> bytes:
        return b"\x01" * n

    async def touched(self) -> None:
        self.woken += 1


def status(state: int, text: str | None = None) -> StreamResponse:
    event = TaskStatusUpdateEvent(task_id="a2a-1", context_id="c", status=TaskStatus(state=state))
    if text:
        event.status.message.CopyFrom(new_text_message(text, role=Role.ROLE_AGENT))
    return StreamResponse(status_update=event)


async def opened(tmp_path: Path) -> tuple[Outbound, Tasks]:
    store = await TaskStore.open(tmp_path / "tasks.sqlite3")
    tasks = Tasks(store)
    links = await LinkStore.open(tmp_path / FILE_NAME)
    return Outbound(tasks, links, tmp_path), tasks  # type: ignore[arg-type]


async def test_each_change_is_one_state_seq_and_the_outcome_is_final(tmp_path: Path) -> None:
    outbound, tasks = await opened(tmp_path)
    store = tasks.store
    await store.create(
        ME, Task.new("t1", "requester", marker(URL), "t", "x"), 1, max_open_per_peer=8
    )
    await outbound.links.add(ME, "t1", URL)
    reading = Reading()

    async def feed(event: StreamResponse) -> Task:
        reading.feed(event)
        return await outbound._applied("t1", reading)

    first = await feed(status(TaskState.TASK_STATE_SUBMITTED))
    assert (first.state, first.state_seq, first.delivered) == ("submitted", 1, 1)
    assert (await feed(status(TaskState.TASK_STATE_WORKING, "on it"))).state_seq == 2
    assert (await feed(status(TaskState.TASK_STATE_WORKING, "on it"))).state_seq == 2  # a repeat
    assert (await feed(status(TaskState.TASK_STATE_WORKING, "half"))).state_seq == 3
    update = TaskArtifactUpdateEvent(
        task_id="a2a-1", context_id="c", artifact=new_text_artifact("a", "the answer")
    )
    assert (await feed(StreamResponse(artifact_update=update))).state_seq == 3  # no new state
    done = await feed(status(TaskState.TASK_STATE_COMPLETED))
    assert (done.state, done.state_seq, done.result) == ("completed", 4, "the answer")
    late = await feed(status(TaskState.TASK_STATE_FAILED, "too late"))
    assert (late.state, late.state_seq) == ("completed", 4)
    history = await store.history(ME, "t1")
    assert [h.state for h in history] == ["submitted", "working", "working", "completed"]
    assert tasks.woken >= 4
    link = await outbound.link("t1")
    assert link is not None and (link.a2a_task_id, link.context_id) == ("a2a-1", "c")
    await outbound.close()
    await store.close()


async def test_a_restart_resumes_links_and_ends_tasks_never_named(tmp_path: Path) -> None:
    outbound, tasks = await opened(tmp_path)
    store = tasks.store
    for task_id in ("named", "lost", "pruned"):
        task = Task.new(task_id, "requester", marker(URL), "t", "x")
        await store.create(ME, task, 1, max_open_per_peer=8)
        await outbound.links.add(ME, task_id, URL)
    await outbound.links.bind(ME, "named", "a2a-1", "c")
    await store.transition(ME, "named", "input_required", 2, by="assignee", note="which?")
    await store.prune(ME, 10**15)  # nothing terminal: nothing pruned
    await outbound.links.add(ME, "gone", URL)  # its task is not in the store
    await outbound.resume()
    lost = await store.get(ME, "lost")
    assert lost is not None and (lost.state, lost.note) == ("failed", LOST_NOTE)
    named = await store.get(ME, "named")
    assert named is not None and named.state == "input_required"
    assert outbound.followers == {}  # a question waits for the model: nothing to follow
    assert await outbound.link("gone") is None
    assert outbound.urls[marker(URL)] == URL
    await outbound.close()
    await store.close()


async def test_a_cancel_before_the_agent_names_the_task_reaches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model cancels while the agent's first answer is late: the cancel is sent once the
    agent names the task, and the task settles on the agent's answer (it never did the work)."""
    from support.a2akit import a2a_agent
    from support.waiting import eventually
    from tools.a2a import outbound as outbound_module

    monkeypatch.setattr(outbound_module, "FIRST_ANSWER_S", 0.05)
    async with a2a_agent() as helper:
        (tmp_path / "owner.toml").write_text(f'[a2a]\nagents = ["{helper.url}"]\n')
        (tmp_path / "owner.toml").chmod(0o600)
        outbound, _ = await opened(tmp_path)
        try:
            sent = await outbound.send(helper.url, "t", "late hold")
            assert sent.state == "submitted"
            asked = await outbound.cancel(sent.task_id, "stop")
            assert (asked.state, asked.cancel_requested) == ("submitted", 1)
            helper.seen.late.set()
            await eventually(lambda: helper.seen.canceled == 1, 10)

            async def settled() -> Task | None:
                task = await outbound.store.get(ME, sent.task_id)
                return task if task is not None and task.state == "canceled" else None

            await eventually(settled, 10)
            link = await outbound.link(sent.task_id)
            assert link is not None and link.a2a_task_id is not None
        finally:
            await outbound.close()
            await outbound.store.close()


async def test_an_answer_to_a_task_the_agent_ended_records_its_outcome(tmp_path: Path) -> None:
    """The agent asks, then ends the task on its side (nothing follows a task while it waits
    for input): the model's answer is refused, and the task takes the agent's outcome
    (canceled), not a failure of ours."""
    import httpx

    from macula.store.tasks import TaskError
    from support.a2akit import a2a_agent
    from support.waiting import eventually

    async with a2a_agent() as helper:
        (tmp_path / "owner.toml").write_text(f'[a2a]\nagents = ["{helper.url}"]\n')
        (tmp_path / "owner.toml").chmod(0o600)
        outbound, _ = await opened(tmp_path)
        try:
            sent = await outbound.send(helper.url, "t", "ask")

            async def asking() -> Task | None:
                task = await outbound.store.get(ME, sent.task_id)
                return task if task is not None and task.state == "input_required" else None

            await eventually(asking, 10)
            link = await outbound.link(sent.task_id)
            assert link is not None and link.a2a_task_id is not None
            ended = {"jsonrpc": "2.0", "id": 1, "method": "CancelTask",
                     "params": {"id": link.a2a_task_id}}  # fmt: skip
            async with httpx.AsyncClient() as http:
                said = await http.post(helper.url, json=ended, headers={"A2A-Version": "1.0"})
            assert said.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED", said.text
            with pytest.raises(TaskError) as refused:
                await outbound.give_input(sent.task_id, "blue")
            assert refused.value.code == "a2a_refused"
            assert refused.value.task is not None and refused.value.task.state == "canceled"
            task = await outbound.store.get(ME, sent.task_id)
            assert task is not None and (task.state, task.error) == ("canceled", None)
        finally:
            await outbound.close()
            await outbound.store.close()
