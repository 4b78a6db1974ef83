"""What a ``Node`` does on each new connection beyond the intent replay after the HELLO:
renew its DHT procedure records, and present its realm endorsements.

Invariant: both run as tasks of the node's group and never raise: a failure is logged (on the
``macula.node.node`` logger) and the connection stays up; the intent tables are read when the task
runs, so what changed meanwhile is what is told.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from macula.client.intent import Key
from macula.errors import MaculaError
from macula.node.session import Session
from macula.services.dht import DhtClient

log = logging.getLogger("macula.node.node")


async def reannounce(dht: DhtClient, announced: Iterable[Key], station_key: bytes) -> None:
    """Store again each announced procedure's record, naming the station we are on now."""
    for realm, procedure in list(announced):
        try:
            await dht.announce_procedure(realm, procedure, station_key)
        except MaculaError as exc:
            log.warning("could not re-announce %s: %s", procedure, exc)


async def present(
    presenter: Callable[[], Awaitable[Iterable[bytes]]],
    session: Session,
    subscriptions: Iterable[Key],
    advertisements: Iterable[Key],
) -> None:
    """Present this identity's realm endorsements (``macula.realm.membership``), then
    tell the station again the intent in the realms it presented: a station protecting a
    realm refused what the replay after the HELLO said of it before the presentation."""
    try:
        realms = set(await presenter())
        for realm, name in subscriptions:
            if realm in realms:
                session.subscribe(realm, name)
        for realm, name in advertisements:
            if realm in realms:
                session.advertise(realm, name)
    except (MaculaError, OSError) as exc:
        log.warning("could not present realm endorsements: %s", exc)
