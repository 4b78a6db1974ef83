"""Presence believes only hellos and goodbyes its publisher signed (a ``publisher_sig``)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from macula.agent.presence import GOODBYE_TOPIC, HELLO_TOPIC, Presence, Profile, hello_payload
from macula.node.node import Node
from macula.node.subscriptions import Delivery
from macula.store.roster import RosterStore
from macula.wire.identity import ZERO_REALM, Identity

NOW = 1_767_225_600_000


def test_unauthenticated_hellos_and_goodbyes_change_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        me, them = Identity.generate(os.urandom), Identity.generate(os.urandom)
        roster = await RosterStore.open(tmp_path / "roster.sqlite3")
        try:
            node = cast(Node, SimpleNamespace(identity=me))
            presence = Presence(node, roster, Profile(), lambda: NOW)
            hello = hello_payload(them.node_id, Profile(operator_name="them"), NOW)

            def heard(topic: str, payload: object, authenticated: bool) -> Delivery:
                return Delivery(ZERO_REALM, topic, them.node_id, 1, payload, authenticated)

            await presence._heard_hello(heard(HELLO_TOPIC, hello, False))
            assert await presence.agents() == []
            assert presence.stats["hello_unauthenticated"] == 1
            await presence._heard_hello(heard(HELLO_TOPIC, hello, True))
            assert [e.node_id for e in await presence.agents()] == [them.node_id]
            goodbye = {"node_id": them.node_id.hex(), "at": NOW}
            await presence._heard_goodbye(heard(GOODBYE_TOPIC, goodbye, False))
            assert len(await presence.agents()) == 1  # an unsigned goodbye removes nobody
            assert presence.stats["goodbye_unauthenticated"] == 1
            await presence._heard_goodbye(heard(GOODBYE_TOPIC, goodbye, True))
            assert await presence.agents() == []
        finally:
            await roster.close()

    asyncio.run(scenario())
