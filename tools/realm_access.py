"""Tools acting in a realm (rooms, rings, hello): make sure the station knows our membership
first, and tell the agent when the station refused what the tool did there.

Why: in a realm a station protects, a SUBSCRIBE or PUBLISH from a non-member is refused
without an answer on the wire; only the connection's refusal counters (``_relay.ping``,
``Node.flush``) show it. So a tool acting in a realm other than the all-zero one:

Invariants:
- before acting, presents this identity's endorsements on the current connection once (the
  join flow presents in the background; a tool must not race it), and refuses at once with
  ``realm_refused`` when the station refused our membership of that realm (revoked, expired:
  its reason is in the detail); a station that does not protect the realm is no refusal;
- after acting, compares the station's ``realm_refused`` counter with its value before: a rise
  is the ``realm_refused`` error (with ``next_action`` naming mesh_join_realm when we hold no
  membership); otherwise the result gains ``realm`` (64 hex) and ``realm_member`` 0/1, and,
  without a membership, a ``realm_hint`` saying that refusals there are silent and that
  anyone the station lets in can read (mesh_list_realms lists the memberships we hold);
- a room the station refused us (``left_if_refused``) is left again, locally: what we would
  publish there reaches nobody, and nothing half-made remains;
- nothing here holds a credential in a result: only tags, 0/1 and reasons.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Final

from macula.agent.agent import Agent
from macula.errors import MaculaError
from macula.realm.membership import Membership
from macula.session import Session
from macula.wire.identity import ZERO_REALM
from tools.agent_arguments import ArgumentProblems
from tools.realms import membership_store
from tools.runtime import Runtime

REFUSED: Final = "realm_refused"
FLUSH_TIMEOUT_S: Final = 10.0
UNHELD_HINT: Final = (
    "you hold no membership of this realm (mesh_list_realms lists those you hold). If the "
    "station protects it, what you do there is refused without an answer on the wire (a "
    "SUBSCRIBE refusal is silent: you would simply hear nothing); if it does not, anyone who "
    "learns the room topic can read. To become a member: mesh_join_realm."
)

# realms this identity's endorsements were presented for, per connection
_presented: weakref.WeakKeyDictionary[Session, set[bytes]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, slots=True)
class RealmGuard:
    realm: bytes
    membership: Membership | None
    refused_before: int


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
    done = _presented.setdefault(session, set())
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


async def _refused_count(runtime: Runtime) -> int:
    return (await runtime.node.flush(FLUSH_TIMEOUT_S)).get(REFUSED, 0)


async def guard(runtime: Runtime, realm: bytes) -> RealmGuard | None:
    """Before acting in ``realm``: None for the all-zero realm, else the guard to ``check``."""
    if realm == ZERO_REALM:
        return None
    membership = membership_store(runtime).get(realm)
    if membership is not None:
        await _present(runtime, membership)
    return RealmGuard(realm, membership, await _refused_count(runtime))


async def check(runtime: Runtime, realm_guard: RealmGuard | None) -> dict[str, Any]:
    """After acting: what the result gains (empty for the all-zero realm), or ``realm_refused``
    if the station refused anything of this connection's meanwhile."""
    if realm_guard is None:
        return {}
    held = realm_guard.membership is not None
    if await _refused_count(runtime) > realm_guard.refused_before:
        raise _refused(
            f"the station refused to let this connection act in realm {realm_guard.realm.hex()}"
            " (it protects the realm and holds no valid membership of yours)",
            held=held,
        )
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
