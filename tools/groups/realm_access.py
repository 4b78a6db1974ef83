"""Tools acting in a realm (rooms, rings, hello, publish, watch, serve): make sure the station
knows our membership first, and tell the agent when the station refused what the tool did.

Why: in a realm a station protects, a SUBSCRIBE or PUBLISH from a non-member is refused
without an answer on the wire; only the station's refusal counters show it, which the node
learns on each ``Node.flush`` and keeps in ``Node.refusals``. So a tool acting in a realm
other than the all-zero one:

Invariants:
- before acting, presents this identity's endorsements on the current connection once (the
  join flow presents in the background; a tool must not race it), and refuses at once with
  ``realm_refused`` when the station refused our membership of that realm (revoked, expired:
  its reason is in the detail); a station that does not protect the realm is no refusal;
- after acting, compares the node's ``realm_refused`` total with its value before: a rise
  is the ``realm_refused`` error (with ``next_action`` naming mesh_join_realm when we hold no
  membership); otherwise the result gains ``realm`` (64 hex) and ``realm_member`` 0/1, and,
  without a membership, a ``realm_hint`` saying that refusals there are silent and that
  anyone the station lets in can read (mesh_list_realms lists the memberships we hold);
- ``acting`` watches more than realm refusals, in any realm (the all-zero one too): a
  PUBLISH, SUBSCRIBE or ADVERTISE the station dropped for another reason (a quota, a name
  someone else serves) fails the tool with that counter's name as its code;
- a room the station refused us (``left_if_refused``) is left again, locally: what we would
  publish there reaches nobody, and nothing half-made remains;
- nothing here holds a credential in a result: only tags, 0/1 and reasons.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Final

from macula.agent.agent import Agent
from macula.errors import MaculaError
from macula.realm.membership import Membership
from macula.services.refusals import (
    ADVERTISE_QUOTA,
    ADVERTISE_REFUSALS,
    ADVERTISE_TAKEN,
    ADVERTISE_TOMBSTONED,
    BUILTIN_ADVERTISE,
    PUBLISH_RATE_LIMITED,
    PUBLISH_REFUSALS,
    REALM_REFUSED,
    RESERVED_ADVERTISE,
    SUBSCRIBE_REFUSALS,
    SUBSCRIPTION_QUOTA,
)
from macula.wire.identity import ZERO_REALM
from tools.groups.agent_arguments import ArgumentProblems
from tools.groups.realms import membership_store
from tools.server.runtime import Runtime

__all__ = [
    "ADVERTISE_REFUSALS",
    "PUBLISH_REFUSALS",
    "REFUSED",
    "SUBSCRIBE_REFUSALS",
    "RealmGuard",
    "acting",
    "check",
    "guard",
    "left_if_refused",
    "subscribe_anew",
]

REFUSED: Final = REALM_REFUSED
FLUSH_TIMEOUT_S: Final = 10.0
UNHELD_HINT: Final = (
    "you hold no membership of this realm (mesh_list_realms lists those you hold). If the "
    "station protects it, what you do there is refused without an answer on the wire (a "
    "SUBSCRIBE refusal is silent: you would simply hear nothing); if it does not, anyone who "
    "learns the room topic can read. To become a member: mesh_join_realm."
)

# what to do about a refusal the station counts without an answer (the names, and which frame
# meets which, are macula.services.refusals'): a rise while a tool acted fails the tool
_NEXT_ACTIONS: Final = {
    ADVERTISE_TAKEN: "another node serves that procedure here: choose another name or realm",
    ADVERTISE_TOMBSTONED: "another node just released that name: try again in a minute",
    ADVERTISE_QUOTA: "you serve as many procedures as this station allows: mesh_unserve one",
    RESERVED_ADVERTISE: "that name is a service of the station itself: choose another",
    BUILTIN_ADVERTISE: "that name is a built-in of the station: choose another",
    SUBSCRIPTION_QUOTA: (
        "this connection holds as many subscriptions as the station allows: leave a room "
        "(mesh_leave_room) or end another watch first"
    ),
    PUBLISH_RATE_LIMITED: "you publish faster than the station allows: wait, then again",
}


@dataclass(frozen=True, slots=True)
class RealmGuard:
    realm: bytes
    membership: Membership | None
    refused_before: Counter[str]  # the node's refusal totals when the guard was taken
    watched: frozenset[str] = frozenset({REFUSED})


def _refused(detail: str, held: bool) -> ArgumentProblems:
    action = (
        "your membership was refused by the station: ask the realm's owner (mesh_join_realm "
        "to join again), or act in another realm"
        if held
        else "join the realm first (mesh_join_realm, then approval by its owner), or omit realm"
    )
    return ArgumentProblems([detail], code=REFUSED, next_action=action)


async def _present(runtime: Runtime, membership: Membership) -> None:
    """Present our endorsements on this connection (once per realm); ``realm_refused`` if the
    station refused the one of ``membership`` for a reason other than not protecting it."""
    realm = membership.endorsement.realm
    session = await runtime.node.session(FLUSH_TIMEOUT_S)
    done = session.presented
    if realm in done:
        return
    answer = await membership_store(runtime).present(session)
    done.add(realm)
    refused = answer.get("refused") if isinstance(answer, dict) else None
    for refusal in refused if isinstance(refused, list) else ():
        if not isinstance(refusal, dict) or refusal.get("realm") != realm:
            continue
        reason = str(refusal.get("reason"))
        if reason != "realm_not_protected":
            done.discard(realm)
            raise _refused(
                f"the station refused your membership of realm {realm.hex()}: {reason} "
                f"({refusal.get('detail')})",
                held=True,
            )


async def _refusals(runtime: Runtime) -> Counter[str]:
    """The node's refusal totals (``Node.refusals``), once the station handled all we sent
    before."""
    await runtime.node.flush(FLUSH_TIMEOUT_S)
    return Counter(runtime.node.refusals.total)


async def guard(runtime: Runtime, realm: bytes) -> RealmGuard | None:
    """Before acting in ``realm``: None for the all-zero realm, else the guard to ``check``."""
    if realm == ZERO_REALM:
        return None
    return await acting(runtime, realm, frozenset({REFUSED}))


async def acting(runtime: Runtime, realm: bytes, watched: frozenset[str]) -> RealmGuard:
    """Before sending frames in ``realm`` (the all-zero one too): the guard whose ``check``
    fails if the station counts one of the ``watched`` refusals meanwhile."""
    membership = None if realm == ZERO_REALM else membership_store(runtime).get(realm)
    if membership is not None:
        await _present(runtime, membership)
    return RealmGuard(realm, membership, await _refusals(runtime), watched)


async def subscribe_anew(runtime: Runtime, realm: bytes, topic: str) -> None:
    """SUBSCRIBE on the live connection even when the node holds the key already (a room tap
    does): the station answers a repeat of a subscription it keeps with nothing, and one it
    refuses (a revoked membership) with a counted refusal, so ``check`` sees it."""
    session = await runtime.node.session(FLUSH_TIMEOUT_S)
    session.subscribe(realm, topic)


def _station_refused(reasons: list[str]) -> ArgumentProblems:
    actions = [_NEXT_ACTIONS.get(reason, "read detail and adjust the call") for reason in reasons]
    return ArgumentProblems(
        [f"the station refused it without an answer on the wire ({', '.join(reasons)})"],
        code=reasons[0],
        next_action="; ".join(dict.fromkeys(actions)),
    )


async def check(runtime: Runtime, realm_guard: RealmGuard | None) -> dict[str, Any]:
    """After acting: what the result gains (empty for the all-zero realm), or the refusal
    (``realm_refused``, else the station's counter name) if the station counted one of the
    guard's watched refusals on this connection meanwhile."""
    if realm_guard is None:
        return {}
    held = realm_guard.membership is not None
    await _refusals(runtime)
    risen = runtime.node.refusals.risen(realm_guard.refused_before, realm_guard.watched)
    if REFUSED in risen:
        raise _refused(
            f"the station refused to let this connection act in realm {realm_guard.realm.hex()}"
            " (it protects the realm and holds no valid membership of yours)",
            held=held,
        )
    if risen:
        raise _station_refused(risen)
    if realm_guard.realm == ZERO_REALM:
        return {}
    view: dict[str, Any] = {"realm": realm_guard.realm.hex(), "realm_member": int(held)}
    if not held:
        view["realm_hint"] = UNHELD_HINT
    return view


async def left_if_refused(
    agent: Agent, room: str, checked: Awaitable[dict[str, Any]]
) -> dict[str, Any]:
    """``checked`` (a ``check``); on ``realm_refused`` the room is left again, then re-raised."""
    try:
        return await checked
    except ArgumentProblems:
        with contextlib.suppress(MaculaError):
            await agent.rooms.leave(room)
        raise
