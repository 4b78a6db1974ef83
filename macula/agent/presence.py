"""Presence: ``agent.hello`` heartbeats, ``agent.goodbye``, and the roster they feed.

Invariants:
- a hello or goodbye counts only when its ``node_id`` equals the publisher the station attests
  (the station checks ``publisher`` against the connection, §13 #7); anything else is counted
  as spoofed and ignored;
- the first beat goes out at once, then every ``interval_seconds`` (minimum 10, default 60);
  a failed beat is logged, never raised, and the next tick tries again;
- after ``goodbye`` nothing restarts presence except an explicit ``hello``;
- all timing is through the injected ``clock`` (Unix ms) and ``asyncio.sleep``;
- hellos and goodbyes go and are heard in one realm's lobby (``realm``: the all-zero realm
  unless ``start`` is given another; a new realm ends the feeds of the old one first);
- stopping waits for the tasks but never swallows the caller's own cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from macula.errors import MaculaError
from macula.node.node import Node
from macula.node.subscriptions import Delivery, Subscription
from macula.services.limits import MAX_AGENT_TEXT_CHARS
from macula.store.roster import HelloFields, RosterEntry, RosterStore
from macula.wire.identity import ZERO_REALM

log = logging.getLogger("macula.agent.presence")

HELLO_TOPIC = "agent.hello"
GOODBYE_TOPIC = "agent.goodbye"
MIN_INTERVAL_S = 10
DEFAULT_INTERVAL_S = 60
MAX_TEXT = MAX_AGENT_TEXT_CHARS  # what the agent directory keeps of each field too


@dataclass(frozen=True, slots=True)
class Profile:
    """What this agent says about itself in ``agent.hello`` (free text, unverified)."""

    operator_name: str | None = None
    session_name: str | None = None
    message: str | None = None
    model: str | None = None
    connected_via: str | None = None
    interval_seconds: int = DEFAULT_INTERVAL_S

    def checked(self) -> Profile:
        if type(self.interval_seconds) is not int or self.interval_seconds < MIN_INTERVAL_S:
            raise ValueError(f"interval_seconds must be an integer >= {MIN_INTERVAL_S}")
        for name in ("operator_name", "session_name", "message", "model", "connected_via"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or len(value) > MAX_TEXT):
                raise ValueError(f"{name} must be text of at most {MAX_TEXT} characters")
        return self


def hello_payload(node_id: bytes, profile: Profile, at_ms: int) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "node_id": node_id.hex(),
        "interval_seconds": profile.interval_seconds,
        "at": at_ms,
    }
    for name in ("operator_name", "session_name", "message", "model", "connected_via"):
        value = getattr(profile, name)
        if value:
            payload[name] = value
    return payload


def parse_hello(payload: object, publisher: bytes) -> HelloFields | None:
    """The hello's fields if it is well formed and attested (``node_id`` == publisher)."""
    if not isinstance(payload, dict) or payload.get("node_id") != publisher.hex():
        return None
    interval = payload.get("interval_seconds", DEFAULT_INTERVAL_S)
    at = payload.get("at")
    if type(interval) is not int or type(at) is not int:
        return None
    texts = {}
    for name in ("operator_name", "session_name", "message", "model", "connected_via"):
        value = payload.get(name)
        texts[name] = value[:MAX_TEXT] if isinstance(value, str) else None
    try:
        return HelloFields(at=at, interval_seconds=max(1, min(interval, 24 * 3600)), **texts)
    except ValueError:
        return None


class Presence:
    def __init__(
        self, node: Node, roster: RosterStore, profile: Profile, clock: Callable[[], int]
    ) -> None:
        self.node = node
        self.roster = roster
        self.profile = profile.checked()
        self.clock = clock
        self.stats: Counter[str] = Counter()
        self.present = False
        self.said_goodbye = False
        self._tasks: list[asyncio.Task[None]] = []  # the roster feeds
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._subscriptions: list[Subscription] = []
        self.last_beat_ms: int | None = None
        self.last_error: str | None = None
        self.realm = ZERO_REALM  # whose lobby the hellos go to and come from

    async def start(
        self, group: asyncio.TaskGroup, profile: Profile | None = None, realm: bytes | None = None
    ) -> None:
        """Start the roster feed and the heartbeat; on a restart (a new profile) only the
        heartbeat starts over: the feed keeps its subscriptions and what they hold, so no hello
        that arrived meanwhile is lost. A ``realm`` other than the current one moves both there."""
        if profile is not None:
            self.profile = profile.checked()
        if realm is not None and realm != self.realm:
            await self.stop_tasks()
            self.realm = realm
        if not self._subscriptions:
            hellos = await self.node.subscribe(self.realm, HELLO_TOPIC, buffer=4096)
            goodbyes = await self.node.subscribe(self.realm, GOODBYE_TOPIC, buffer=4096)
            self._subscriptions = [hellos, goodbyes]
            self._tasks = [
                group.create_task(self._feed(hellos, self._heard_hello)),
                group.create_task(self._feed(goodbyes, self._heard_goodbye)),
            ]
            with contextlib.suppress(MaculaError):  # listening before our first hello goes out
                await self.node.flush(timeout=5)
        await self._stop_heartbeat()
        self.present, self.said_goodbye = True, False
        self._heartbeat_task = group.create_task(self._heartbeat())

    async def _stop_heartbeat(self) -> None:
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def goodbye(self) -> None:
        """Publish one ``agent.goodbye`` and stop; only ``start`` brings presence back."""
        if self.present:
            with contextlib.suppress(MaculaError):
                payload = {"node_id": self.node.identity.node_id.hex(), "at": self.clock()}
                await self.node.publish(self.realm, GOODBYE_TOPIC, payload, timeout=5)
        self.present, self.said_goodbye = False, True
        await self.stop_tasks()

    async def stop_tasks(self) -> None:
        """Cancel the heartbeat and the feeds, wait for them, close the subscriptions.

        Waiting never swallows a cancellation of the caller itself (``asyncio.wait`` raises it);
        the tasks' own outcomes are their task group's business."""
        tasks, self._tasks = self._tasks, []
        if self._heartbeat_task is not None:
            tasks.append(self._heartbeat_task)
            self._heartbeat_task = None
        subscriptions, self._subscriptions = self._subscriptions, []
        try:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)
        finally:
            for sub in subscriptions:
                await sub.close()

    async def beat(self) -> None:
        now = self.clock()
        payload = hello_payload(self.node.identity.node_id, self.profile, now)
        await self.node.publish(self.realm, HELLO_TOPIC, payload, timeout=10)
        self.last_beat_ms = now

    async def _heartbeat(self) -> None:
        while True:
            try:
                await self.beat()
                self.last_error = None
                await self.roster.prune(self.clock())
            except MaculaError as exc:
                self.last_error = str(exc)
                log.warning("heartbeat failed (will retry): %s", exc)
            await asyncio.sleep(self.profile.interval_seconds)

    async def _feed(self, sub: Subscription, handle: Callable[[Delivery], Any]) -> None:
        async for delivery in sub:
            try:
                await handle(delivery)
            except Exception:
                log.exception("presence event not recorded")

    async def _heard_hello(self, delivery: Delivery) -> None:
        if not delivery.authenticated:  # no publisher_sig: the station's word alone, not theirs
            self.stats["hello_unauthenticated"] += 1
            return
        fields = parse_hello(delivery.payload, delivery.publisher)
        if fields is None:
            self.stats["hello_ignored"] += 1
            return
        await self.roster.upsert_hello(delivery.publisher, fields, self.clock())
        self.stats["hello_recorded"] += 1

    async def _heard_goodbye(self, delivery: Delivery) -> None:
        payload = delivery.payload
        if not delivery.authenticated:
            self.stats["goodbye_unauthenticated"] += 1
            return
        if not isinstance(payload, dict) or payload.get("node_id") != delivery.publisher.hex():
            self.stats["goodbye_ignored"] += 1
            return
        await self.roster.remove(delivery.publisher)
        self.stats["goodbye_recorded"] += 1

    async def agents(self, limit: int = 50, offset: int = 0) -> list[RosterEntry]:
        return await self.roster.list(self.clock(), limit, offset)

    def with_profile(self, **changes: Any) -> Profile:
        """The current profile with the given (non-None) fields replaced."""
        return replace(self.profile, **{k: v for k, v in changes.items() if v is not None})
