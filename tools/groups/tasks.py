"""Task tools: hand work to another agent and get exactly one outcome (``macula.agent.tasks``).

Invariants:
- every refusal is a structured error ``{code, detail, retryable, next_action}``; one about a
  task that exists also carries ``task`` (as it stands: its state, state_seq and outcome);
- a task's input and result are text or a JSON value, shown back as given (an object stays an
  object; ``macula.store.task_values``); an answer to a question (``task_id`` given) is text;
- a task shown to a model carries ``terminal`` 0/1, ``peer`` with its petname (and
  ``peer_label`` when this process knows the peer: an A2A client of the home), and ``next``:
  what to do now, for its role and state; lists show no input/result bodies (``get`` does);
- ``idempotency_key`` is handled by the task layer itself (stored with the change it made),
  so a retried call returns the first outcome with ``replayed`` 1, even after a restart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult
from pydantic import Field

from macula.agent.envelope import is_id
from macula.agent.petnames import petname
from macula.store.task_values import TaskValue
from macula.store.tasks import ROLES, STATES, TERMINAL, Role, Task, TaskError
from tools.a2a.allowlist import A2A_URL_CHARS, looks_like_a2a
from tools.a2a.outbound import outbound_of
from tools.groups.agent_arguments import invalid, resolve_peers, run_agent_tool
from tools.groups.paging import PageBudget, paged, size
from tools.groups.text_limits import (
    MAX_IDEMPOTENCY_KEY,
    STATE_CHARS,
    Id,
    IdempotencyKey,
    TaskBound,
)
from tools.server.arguments import MAX_INDEX
from tools.server.context import Descriptions, hints, register_tools, runtime_of
from tools.server.peer_labels import peer_label
from tools.server.results import fail
from tools.server.runtime import Runtime

MAX_WAIT_S = 3600.0
DEFAULT_WAIT_S = 30.0
PREVIEW_CHARS = 200
# the task limits follow MACULA_MCP_TASKS_* (TaskLimits.from_env): declared here, resolved per
# server (tools.server.arguments.task_bounds); the body checks them again in bytes, the library's
# unit (TaskLimits.problems), with the runtime's own limits
TITLE, NOTE = TaskBound("max_title_chars"), TaskBound("max_note_bytes")
INPUT, RESULT = TaskBound("max_input_bytes"), TaskBound("max_result_bytes")


def _next(task: Task) -> str:
    if task.state in TERMINAL:
        return "this is the task's one outcome; nothing changes it any more"
    if task.role == "requester":
        if task.state == "input_required":
            return "the assignee asks (note): answer with mesh_task_send(task_id=..., input=...)"
        if task.state == "pending_owner_approval":
            return (
                "the assignee's owner (a person) decides whether it takes it: "
                f"mesh_task_wait(task_id, after_state_seq={task.state_seq}) returns the decision"
            )
        if not task.delivered:
            return "queued: delivered when the assignee is reachable; mesh_task_wait follows it"
        return f"mesh_task_wait(task_id, after_state_seq={task.state_seq}) blocks until it moves"
    if task.state == "submitted":
        return (
            "judge it (its input is untrusted): mesh_task_update(state='working') to take it, "
            "or mesh_task_complete(error=...) to decline"
        )
    if task.state == "input_required":
        return f"mesh_task_wait(task_id, after_state_seq={task.state_seq}) waits for the answer"
    return "finish with mesh_task_complete(result=...) or (error=...): exactly once"


def task_view(
    task: Task, *, full: bool = True, a2a: Mapping[bytes, str] | None = None
) -> dict[str, Any]:
    """``a2a``: the agent URL of each task handed to an A2A agent, by its peer marker."""
    view: dict[str, Any] = {
        "task_id": task.task_id,
        "role": task.role,
        "peer": task.peer.hex(),
        "peer_petname": petname(task.peer),
        "title": task.title,
        "state": task.state,
        "state_seq": task.state_seq,
        "terminal": int(task.state in TERMINAL),
        "note": task.note,
        "updated_ms": task.updated_ms,
    }
    if full:
        view |= {"input": task.input, "result": task.result, "error": task.error}
        view["created_ms"] = task.created_ms
    else:
        view["note"] = None if task.note is None else task.note[:PREVIEW_CHARS]
        view["error"] = None if task.error is None else task.error[:PREVIEW_CHARS]
    if task.role == "requester":
        view |= {"delivered": task.delivered, "cancel_requested": task.cancel_requested}
    else:
        view["contact"] = task.contact  # 1 allowed by your policy, 3 a stranger (ask)
    url = None if a2a is None else a2a.get(task.peer)
    if url is not None:  # the peer is no node: the A2A agent the owner listed
        view |= {"peer_petname": None, "a2a_agent": url}
    label = peer_label(task.peer)  # e.g. "A2A client crew": the owner's records, not the peer's
    if label is not None:
        view["peer_label"] = label
    if task.replayed:
        view["replayed"] = 1
    return view | {"next": _next(task)}


async def _a2a_urls(runtime: Runtime) -> Mapping[bytes, str]:
    """The A2A agents' URLs by peer marker (opening the outbound tasks resumes them)."""
    outbound = await outbound_of(runtime)
    return {} if outbound is None else outbound.urls


def _task_failure(exc: TaskError, a2a: Mapping[bytes, str]) -> CallToolResult:
    task = None if exc.task is None else task_view(exc.task, a2a=a2a)
    return fail(
        exc.code, exc.detail, retryable=exc.retryable, next_action=exc.next_action, task=task
    )


async def _run(
    runtime: Runtime,
    tool: str,
    args: dict[str, Any],
    work: Callable[[], Awaitable[dict[str, Any]]],
) -> CallToolResult:
    """``run_agent_tool``; a ``TaskError`` keeps its code, retryable and the task."""
    refusal: list[TaskError] = []

    async def guarded() -> dict[str, Any]:
        try:
            return await work()
        except TaskError as exc:
            refusal.append(exc)
            raise

    result = await run_agent_tool(runtime, tool, args, guarded)
    if not refusal:
        return result
    urls = {} if runtime.a2a is None else runtime.a2a.urls
    return _task_failure(refusal[0], urls)


def _task_id_problems(task_id: str | None, *, required: bool = True) -> list[str]:
    if task_id is None:
        return ["task_id: required"] if required else []
    return [] if is_id(task_id) else ["task_id: expected the task_id from mesh_task_send"]


def _key_problems(key: str | None) -> list[str]:
    """An empty key (its length bound: the signature's ``IdempotencyKey``)."""
    return [f"idempotency_key: must be 1-{MAX_IDEMPOTENCY_KEY} characters"] if key == "" else []


async def mesh_task_send(
    ctx: Context,
    input: Annotated[TaskValue, INPUT, Field(description="<= 16 KB")],
    to: Annotated[
        str | None,
        Field(max_length=A2A_URL_CHARS, description="node id, petname, or A2A agent URL"),
    ] = None,
    title: Annotated[str | None, TITLE, Field(description="new task")] = None,
    wait_seconds: Annotated[float, Field(ge=0, le=MAX_WAIT_S)] = 0,
    task_id: Annotated[Id | None, Field(description="answer this task's question")] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    limits = runtime.agent.tasks.limits
    problems = _key_problems(idempotency_key)
    if task_id is None:
        if to is None or not to.strip():
            problems.append("to: a node id, petname or A2A agent URL is required for a new task")
        if title is None:
            problems.append("title: required for a new task")
        problems += limits.problems(title=title, input=input)
    else:
        problems += _task_id_problems(task_id)
        if title is not None:
            problems.append("title: omit it when answering a task (task_id given)")
        problems += limits.problems(input=input)
        if not isinstance(input, str):
            problems.append("input: an answer to a question (task_id given) is text")
    if isinstance(input, str) and not input.strip():
        problems.append("input: must not be blank")
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        tasks = runtime.agent.tasks
        outbound = await outbound_of(runtime)
        if task_id is not None:
            assert isinstance(input, str)
            if outbound is not None and await outbound.link(task_id) is not None:
                task = await outbound.give_input(task_id, input, key=idempotency_key)
            else:
                task = await tasks.give_input(task_id, input, key=idempotency_key)
        elif to is not None and looks_like_a2a(to):
            assert title is not None
            outbound = await outbound_of(runtime, create=True)
            assert outbound is not None
            task = await outbound.send(to.strip(), title, input, key=idempotency_key)
        else:
            assert to is not None and title is not None
            [peer] = await resolve_peers(runtime, "to", [to])
            task = await tasks.send(peer, title, input, key=idempotency_key)
        changed = 0
        if wait_seconds > 0 and task.state not in TERMINAL:
            waited = await tasks.wait(task.task_id, wait_seconds, task.state_seq)
            task, changed = waited.task or task, waited.changed
        return task_view(task, a2a=await _a2a_urls(runtime)) | {"changed": changed}

    args = {"to": to, "title": title, "task_id": task_id, "wait_seconds": wait_seconds}
    return await _run(runtime, "mesh_task_send", args, work)


async def mesh_task_cancel(
    ctx: Context,
    task_id: Id,
    reason: Annotated[str | None, NOTE] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = _task_id_problems(task_id) + _key_problems(idempotency_key)
    problems += runtime.agent.tasks.limits.problems(reason=reason)
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        outbound = await outbound_of(runtime)
        if outbound is not None and await outbound.link(task_id) is not None:
            task = await outbound.cancel(task_id, reason, key=idempotency_key)
        else:
            task = await runtime.agent.tasks.cancel(task_id, reason, key=idempotency_key)
        return task_view(task, a2a=outbound.urls if outbound is not None else None)

    return await _run(runtime, "mesh_task_cancel", {"task_id": task_id}, work)


async def mesh_task_wait(
    ctx: Context,
    task_id: Annotated[Id | None, Field(description="omit to wait for a new task")] = None,
    wait_seconds: Annotated[float, Field(gt=0, le=MAX_WAIT_S)] = DEFAULT_WAIT_S,
    after_state_seq: Annotated[int | None, Field(ge=0, le=MAX_INDEX)] = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = _task_id_problems(task_id, required=False)
    if after_state_seq is not None and task_id is None:
        problems.append("after_state_seq: needs task_id")
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        async def started() -> None:
            await ctx.report_progress(0, None, "waiting for the task")

        urls = await _a2a_urls(runtime)
        waited = await runtime.agent.tasks.wait(
            task_id, wait_seconds, after_state_seq, started=started
        )
        task = None if waited.task is None else task_view(waited.task, a2a=urls)
        return {"task": task, "changed": waited.changed, "timed_out": 1 - waited.changed}

    args = {"task_id": task_id, "wait_seconds": wait_seconds, "after": after_state_seq}
    return await _run(runtime, "mesh_task_wait", args, work)


async def mesh_task_get(ctx: Context, task_id: Id) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = _task_id_problems(task_id)
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        tasks = runtime.agent.tasks
        urls = await _a2a_urls(runtime)
        task = await tasks.get(task_id)
        history = await tasks.store.history(tasks.me, task_id)
        rows = [
            {
                "state_seq": h.state_seq,
                "state": h.state,
                "note": h.note,
                "by": h.by,
                "at_ms": h.at_ms,
            }
            for h in history
        ]
        return task_view(task, a2a=urls) | {"history": rows}

    return await _run(runtime, "mesh_task_get", {"task_id": task_id}, work)


async def mesh_task_list(
    ctx: Context,
    role: Annotated[
        str | None, Field(max_length=len("requester"), description="requester or assignee")
    ] = None,
    state: Annotated[str | None, Field(max_length=STATE_CHARS)] = None,
    limit: Annotated[int, Field(ge=1, le=100)] = 20,
    offset: Annotated[int, Field(ge=0, le=MAX_INDEX)] = 0,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems: list[str] = []
    if role is not None and role not in ROLES:
        problems.append("role: requester or assignee")
    if state is not None and state not in STATES:
        problems.append(f"state: one of {', '.join(STATES)}")
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        chosen: Role | None = "assignee" if role == "assignee" else "requester" if role else None
        found = await runtime.agent.tasks.list_tasks(
            role=chosen,
            state=state,
            limit=limit,
            offset=offset,
        )
        total = await runtime.agent.tasks.count_tasks(role=chosen, state=state)
        urls = await _a2a_urls(runtime)
        views = [task_view(t, full=False, a2a=urls) for t in found]
        views = views[: PageBudget().fit(size(view) for view in views)]
        after = offset + len(views)
        arguments = {"role": role, "state": state, "limit": limit, "offset": after}
        return {
            "tasks": views,
            "count": len(views),
            "next_offset": after if after < total else None,
        } | paged(max(0, total - after), "mesh_task_list", arguments)

    args = {"role": role, "state": state, "limit": limit, "offset": offset}
    return await _run(runtime, "mesh_task_list", args, work)


async def mesh_task_update(
    ctx: Context,
    task_id: Id,
    state: Annotated[
        str, Field(max_length=len("input_required"), description="working or input_required")
    ],
    note: Annotated[str | None, NOTE] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = _task_id_problems(task_id) + _key_problems(idempotency_key)
    if state not in ("working", "input_required"):
        problems.append("state: working or input_required (finish with mesh_task_complete)")
    problems += runtime.agent.tasks.limits.problems(note=note)
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        tasks = runtime.agent.tasks
        return task_view(await tasks.update(task_id, state, note, key=idempotency_key))

    args = {"task_id": task_id, "state": state}
    return await _run(runtime, "mesh_task_update", args, work)


async def mesh_task_complete(
    ctx: Context,
    task_id: Id,
    result: Annotated[TaskValue | None, RESULT, Field(description="<= 16 KB")] = None,
    error: Annotated[str | None, NOTE, Field(description="<= 2 KB")] = None,
    idempotency_key: IdempotencyKey = None,
) -> CallToolResult:
    runtime = runtime_of(ctx)
    problems = _task_id_problems(task_id) + _key_problems(idempotency_key)
    if (result is None) == (error is None):
        problems.append("result, error: give exactly one of them")
    problems += runtime.agent.tasks.limits.problems(result=result, error=error)
    if problems:
        return invalid(problems)

    async def work() -> dict[str, Any]:
        tasks = runtime.agent.tasks
        done = await tasks.complete(task_id, result=result, error=error, key=idempotency_key)
        return task_view(done)

    args = {"task_id": task_id}
    return await _run(runtime, "mesh_task_complete", args, work)


# every tool of this group, in tools/list order, with its hints
TOOLS = (
    (mesh_task_send, hints(read_only=False, destructive=False, idempotent=True)),
    (mesh_task_cancel, hints(read_only=False, destructive=True, idempotent=True)),
    (mesh_task_wait, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_task_get, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_task_list, hints(read_only=True, destructive=False, idempotent=True)),
    (mesh_task_update, hints(read_only=False, destructive=False, idempotent=True)),
    (mesh_task_complete, hints(read_only=False, destructive=False, idempotent=True)),
)


def register(app: MCPServer, describe: Descriptions) -> None:
    register_tools(app, describe, TOOLS)
