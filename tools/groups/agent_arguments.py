"""What the agent tool groups (``tools.groups.presence``, ``tools.groups.rooms``,
``tools.groups.rings``) share:
argument checks, naming peers (node id or petname), and errors that list every problem.

Invariants:
- argument checks collect *every* problem before answering; a failure is ``invalid_argument``
  with ``problems`` (each ``"<argument>: <why>"``), never only the first;
- a petname resolves only against this agent's own roster; zero or several matches fail with
  ``unknown_agent`` / ``ambiguous_agent`` and ``candidates`` naming what the caller may have meant;
  what reaches a ring or the allowlist is always the resolved node id;
- library errors that carry ``problems`` (``EnvelopeError``, ``RingError``) or ``candidates``
  (``PetnameError``) keep those lists in the tool error; everything else is mapped by
  ``tools.server.results.from_error`` through ``run_tool``, unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mcp_types import CallToolResult

from macula.agent.envelope import LOBBY_TOPIC, is_node_hex, is_room_topic
from macula.agent.petnames import PetnameError
from tools.server.results import InvalidArgument, fail
from tools.server.runtime import Runtime, run_tool

ROOM_TOPIC_SHAPE = "agents.room.<32 lowercase hex>"


class ArgumentProblems(InvalidArgument):
    """Every problem found with a call's arguments; ``candidates`` per argument, if any."""

    def __init__(
        self,
        problems: Sequence[str],
        candidates: dict[str, list[str]] | None = None,
        *,
        code: str = "invalid_argument",
        next_action: str = "fix every listed problem and call again",
    ) -> None:
        self.problems = list(problems)
        self.candidates = candidates or {}
        self.code = code
        self.next_action = next_action
        super().__init__("; ".join(self.problems))


def invalid(problems: Sequence[str]) -> CallToolResult:
    """``invalid_argument`` listing every problem found by a tool's own checks."""
    return fail(
        "invalid_argument",
        "; ".join(problems),
        retryable=False,
        next_action="fix every listed problem and call again",
        problems=list(problems),
    )


def room_problems(name: str, topic: str, *, central_ok: bool) -> list[str]:
    if is_room_topic(topic) or (central_ok and topic == LOBBY_TOPIC):
        return []
    where = f"{LOBBY_TOPIC!r} or {ROOM_TOPIC_SHAPE}" if central_ok else ROOM_TOPIC_SHAPE
    return [f"{name}: expected {where}"]


async def run_agent_tool(
    runtime: Runtime,
    tool: str,
    args: dict[str, Any],
    work: Callable[[], Awaitable[dict[str, Any]]],
    *,
    idempotency_key: str | None = None,
    mesh: bool = True,
) -> CallToolResult:
    """``run_tool``, with errors that keep their lists (problems, candidates)."""
    caught: list[BaseException] = []

    async def tracked() -> dict[str, Any]:
        try:
            return await work()
        except Exception as exc:
            caught.append(exc)
            raise

    result = await run_tool(
        runtime, tool, args, tracked, idempotency_key=idempotency_key, mesh=mesh
    )
    if not result.is_error or not caught:
        return result
    return _with_lists(result, caught[0])


def _with_lists(result: CallToolResult, exc: BaseException) -> CallToolResult:
    if isinstance(exc, PetnameError):  # a library path that resolved a name by itself
        exc = _unresolved([("name", str(exc), exc.candidates)])
    if isinstance(exc, ArgumentProblems):
        return fail(
            exc.code,
            str(exc),
            retryable=False,
            next_action=exc.next_action,
            problems=exc.problems,
            candidates=exc.candidates,
        )
    problems = getattr(exc, "problems", None)  # EnvelopeError, RingError
    if isinstance(problems, tuple | list) and problems:
        return fail(
            "invalid_argument",
            str(exc),
            retryable=False,
            next_action="fix every listed problem and call again",
            problems=[str(p) for p in problems],
        )
    return result


def _unresolved(found: list[tuple[str, str, Sequence[str]]]) -> ArgumentProblems:
    """One error for every name that did not resolve: ``(argument, why, candidates)``."""
    ambiguous = any(len(c) > 1 and all(is_node_hex(x) for x in c) for _, _, c in found)
    unknown = any("no agent in your roster" in why for _, why, _ in found)
    if ambiguous:
        code, action = "ambiguous_agent", "use one of the candidate node ids instead of the petname"
    elif unknown:
        code, action = (
            "unknown_agent",
            "check the name with mesh_agents (petnames resolve only against agents you have "
            "seen), or pass the 64-hex node id",
        )
    else:
        code, action = "invalid_argument", "pass a 64-hex node id or a petname from mesh_agents"
    return ArgumentProblems(
        [f"{arg}: {why}" for arg, why, _ in found],
        {arg: list(c) for arg, _, c in found if c},
        code=code,
        next_action=action,
    )


async def resolve_peers(runtime: Runtime, argument: str, names: Sequence[str]) -> list[bytes]:
    """Node ids for node ids or roster petnames; ``ArgumentProblems`` naming every failure."""
    resolved: list[bytes] = []
    found: list[tuple[str, str, Sequence[str]]] = []
    single = len(names) == 1 and argument != "participants"
    for i, name in enumerate(names):
        where = argument if single else f"{argument}[{i}]"
        try:
            node_id = await runtime.agent.resolve(name)
        except PetnameError as exc:
            found.append((where, str(exc), exc.candidates))
            continue
        if node_id in resolved:
            found.append((where, f"{name!r} names the same agent as an earlier entry", ()))
        resolved.append(node_id)
    if found:
        raise _unresolved(found)
    return resolved
