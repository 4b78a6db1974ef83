"""Who answers a CALL the router sent to this station (``RunBuiltin``): a built-in (§6.6) or a
house service.

``answer`` picks by procedure: ``_realm.present`` is the calling connection presenting its
endorsements (``Builtins.present``), ``_relay.ping`` a built-in that also reports the refusals
this connection was not told in-band (counted by the core), any other built-in
``Builtins.run``, everything else the house services. While the house is not open yet (the
station is starting), or when a house service fails, the answer is TEMPORARY_RELAY_FAILURE.
Never raises for a failing service; ``run_builtin`` carries the outcome back to the core (the
station runs it as a task of its group for each ``RunBuiltin``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from macula import clock
from macula.wire.codes import ErrorCode
from relay.builtins.outcome import Outcome
from relay.builtins.procedures import Builtins
from relay.core.actions import Action, RunBuiltin
from relay.core.router import BUILTINS, RouterCore
from relay.house.services import HouseServices

log = logging.getLogger("macula.relay")


async def _ping(builtins: Builtins, action: RunBuiltin, now_ms: int, now_us: int) -> Outcome:
    outcome = await builtins.run(action.call.procedure, action.call.payload, now_ms, now_us)
    if isinstance(outcome.payload, dict):
        outcome = Outcome.result({**outcome.payload, "refused": dict(action.refused)})
    return outcome


async def _house(
    house: HouseServices | None, from_station: int, action: RunBuiltin, now_ms: int
) -> Outcome:
    if house is None:
        return Outcome.error(ErrorCode.TEMPORARY_RELAY_FAILURE)  # still starting
    call = action.call
    try:
        return await house.handle(
            call.procedure, call.payload, call.caller, now_ms, from_station=from_station
        )
    except Exception:
        log.exception("house service %s failed", call.procedure)
        return Outcome.error(ErrorCode.TEMPORARY_RELAY_FAILURE)


async def run_builtin(
    action: RunBuiltin,
    core: RouterCore,
    builtins: Builtins,
    house: HouseServices | None,
    run: Callable[[list[Action]], None],
) -> None:
    """Answer ``action`` and hand its outcome to the core; ``run`` carries out what follows."""
    outcome = await answer(action, core, builtins, house, clock.now_ms(), clock.now_us())
    run(core.builtin_done(action.conn, action.stream, action.call, outcome, clock.now_ms()))


async def answer(
    action: RunBuiltin,
    core: RouterCore,
    builtins: Builtins,
    house: HouseServices | None,
    now_ms: int,
    now_us: int,
) -> Outcome:
    """The outcome of the CALL in ``action`` (as the core's ``builtin_done`` takes it)."""
    call = action.call
    if call.procedure == "_realm.present":
        return await builtins.present(core.realms, action.conn, call.caller, call.payload, now_ms)
    if call.procedure == "_relay.ping":
        if house is not None:  # a publisher's confirmation: its room messages are kept
            await house.settled()
        return await _ping(builtins, action, now_ms, now_us)
    if call.procedure in BUILTINS:
        return await builtins.run(call.procedure, call.payload, now_ms, now_us)
    peer = core.peers.get(action.conn)
    from_station = int(peer is not None and peer.is_station)  # the link says, not the CALL
    return await _house(house, from_station, action, now_ms)
