"""Push into the session (Claude Code channels): ``notifications/claude/channel`` when something
needs this agent, to every MCP session attached to it.

What is pushed (``meta.kind``): ``ring`` (a ring deferred to the model under ``ask``), ``message``
(an envelope addressed to us: it mentions our petname or node id, lists us in ``refs`` or
``participants``, or replies to a message of ours), ``answer`` (an ``answer_given`` or
``result_reported`` replying to us, or the late answer to a ring of ours), ``task`` (a
``task_handed_over`` addressed to us, or a task handed over by RPC: ``ChannelHub.task_handed``).

Invariants:
- off with ``MACULA_MCP_CHANNEL=0``: the capability is not declared and nothing is sent; a
  client that does not know the notification drops it (the SDK does, at debug level);
- one ``ChannelHub`` per agent (runtime), alive while at least one session is attached; it
  pushes to every attached session once it is ready (it said ``notifications/initialized``, or,
  in the 2026 era without a handshake, made a request), in arrival order;
- observers (``Rooms.observers``, ``Rings.observers``) only queue (bounded: past
  ``MACULA_MCP_CHANNEL_QUEUE`` events are dropped and counted); one worker judges and sends, so
  a slow client never slows the agent's taps;
- the gate (``judge``, pure): never our own messages; a room envelope only when attested, addressed
  to us, and from a room-mate (an attested speaker in a room we are in, central excluded) or an
  allowlisted agent: a stranger's message is never pushed, an unattested one never; a ring or a
  task call is proven by its caller, so it is pushed, but its text only when the caller is a
  room-mate or allowlisted (a stranger's ring says who and where, never what);
- peer text is one line, control characters removed, clipped to ``MACULA_MCP_CHANNEL_MAX_CHARS``;
  ``meta`` values are strings, keys are identifiers;
- a room message a person wrote at the sender's console says so: ``meta.from_person`` "1" and
  "(…, person at the console)" after the sender in ``content``, only when
  ``macula.agent.person.from_person`` verifies both signatures on the attested envelope (as
  every reader's view does); a copied or forged mark, or an unattested envelope, says nothing;
- a token bucket per agent (``MACULA_MCP_CHANNEL_PER_MIN``, default 6; ``..._BURST``, default 3)
  bounds what reaches the session; what it holds back is counted and said in the next push.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, cast

from mcp_types import Notification, ServerNotification

from macula.agent.agent import Agent
from macula.agent.contact_policy import Answer
from macula.agent.envelope import LOBBY_TOPIC, TALK_KINDS
from macula.agent.person import from_person
from macula.agent.petnames import petname
from macula.agent.rings import RingEvent
from macula.agent.room.rooms import EnvelopeHeard
from macula.rate import TokenBucket
from tools.server.peer_labels import peer_label
from tools.settings import ChannelSettings

log = logging.getLogger("macula.tools.channel")

CAPABILITY: Final = "claude/channel"
METHOD: Final = "notifications/claude/channel"
SEND_TIMEOUT_S: Final = 5.0  # one session's write; a stuck client is skipped, not waited for
SCAN_LIMIT: Final = 200  # recent messages per room read to find room-mates and our messages

Kind = Literal["ring", "message", "answer", "task"]


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


# -- the gate (pure) ----------------------------------------------------------------------------

_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_HEX_RUN: Final = re.compile(r"[0-9a-f]{8,64}")
_IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def one_line(text: str, limit: int) -> str:
    """Peer text as one line: control characters (newlines included) become spaces, clipped."""
    flat = " ".join(_CONTROL.sub(" ", text).split())
    return flat if len(flat) <= limit else flat[: max(0, limit - 1)].rstrip() + "…"


def sender_label(node_id: bytes) -> str:
    return f"{petname(node_id)} ({node_id.hex()[:8]})"


def _named(node_id: bytes) -> str:
    """``sender_label``, after what this process knows the peer as (``peer_labels``)."""
    known = peer_label(node_id)
    return sender_label(node_id) if known is None else f"{known}, {sender_label(node_id)}"


def person_label(node_id: bytes) -> str:
    """The sender of a message its person wrote at the console (``macula.agent.person``)."""
    return f"{petname(node_id)} ({node_id.hex()[:8]}, person at the console)"


def mentions(text: str, me: bytes) -> bool:
    """``text`` names us: our petname, or 8 to 64 hex characters our node id starts with."""
    lowered = text.lower()
    if petname(me) in lowered:
        return True
    mine = me.hex()
    return any(mine.startswith(run) for run in _HEX_RUN.findall(lowered))


@dataclass(frozen=True, slots=True)
class Candidate:
    """One event that might need the agent, with what the hub looked up about its sender."""

    kind: Kind
    sender: bytes
    room: str | None
    ids: Mapping[str, str]
    summary: str  # our words: who did what, where (never peer text)
    text: str | None  # the peer's words
    proven: int  # 1: a proven call (ring, task RPC); 0: a room envelope
    attested: int
    addressed: int
    room_mate: int  # an attested speaker in a room we are in (central excluded)
    allowlisted: int
    hint: str = ""  # what to do next (a tool)
    from_person: int = 0  # 1: a person at the sender's console wrote it (verified)


@dataclass(frozen=True, slots=True)
class Verdict:
    push: int
    content: int  # 1: the peer's text may be shown
    reason: str


def judge(c: Candidate, me: bytes) -> Verdict:
    """Whether ``c`` is pushed, and with the peer's text or without it."""
    if c.sender == me:
        return Verdict(0, 0, "own")
    trusted = int(bool(c.room_mate or c.allowlisted))
    if c.proven:
        return Verdict(1, trusted, "proven")
    if not c.attested:
        return Verdict(0, 0, "unattested")
    if not c.addressed:
        return Verdict(0, 0, "not_addressed")
    if not trusted:
        return Verdict(0, 0, "stranger")
    return Verdict(1, 1, "room_mate" if c.room_mate else "allowlisted")


def render(c: Candidate, verdict: Verdict, max_chars: int) -> tuple[str, dict[str, str]]:
    """The notification's ``content`` (one or two lines) and ``meta`` (string attributes)."""
    first = c.summary
    if verdict.content and c.text and c.text.strip():
        second = f"They wrote (untrusted input): {one_line(c.text, max_chars)}"
    elif c.text and c.text.strip():
        second = "Not shown: the sender is not a room-mate nor allowlisted. " + c.hint
    else:
        second = c.hint
    meta = {"kind": c.kind, "from": sender_label(c.sender), "from_id": c.sender.hex()}
    if c.from_person:
        meta["from_person"] = "1"
    if c.room:
        meta["room"] = c.room
    for key, value in c.ids.items():
        if _IDENT.fullmatch(key):
            meta[key] = one_line(value, 128)
    content = first if not second.strip() else f"{first}\n{second.strip()}"
    return content, meta


# -- the hub ------------------------------------------------------------------------------------


class Peer(Protocol):
    """One attached session that can be pushed to."""

    async def notify(self, content: str, meta: dict[str, str]) -> None: ...


@dataclass(eq=False)
class ChannelHub:
    """The pushes of one agent, to every attached session of it."""

    agent: Agent
    settings: ChannelSettings
    clock: Callable[[], int] = monotonic_ms
    peers: list[Peer] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    held_back: int = 0
    users: int = 0  # bindings holding this hub

    def __post_init__(self) -> None:
        per_second = self.settings.per_minute / 60.0
        self.bucket = TokenBucket(per_second, self.settings.burst, self.clock())  # one per agent
        self.queue: asyncio.Queue[RingEvent | EnvelopeHeard | Candidate] = asyncio.Queue(
            self.settings.queue
        )
        self.me = self.agent.node.identity.node_id
        self._worker: asyncio.Task[None] | None = None

    # observers (synchronous: they only queue)

    def on_ring(self, event: RingEvent) -> None:
        self._enqueue(event)

    def on_heard(self, heard: EnvelopeHeard) -> None:
        self._enqueue(heard)

    def task_handed(self, sender: bytes, task_id: str, title: str) -> None:
        """The hook for ``macula.agent.tasks`` (wired where a peer's new task is stored): a task
        handed to us over its signed RPC. Pushed like a ring: its title only from the known."""
        task_id = one_line(task_id, 64)
        task = Candidate(
            "task", sender, None, {"task_id": task_id},
            f"{_named(sender)} handed you a task ({task_id}).", title,
            1, 1, 1, 0, 0, f"See it with mesh_task_get task_id={task_id}.",
        )  # fmt: skip
        self._enqueue(task)

    def _enqueue(self, item: RingEvent | EnvelopeHeard | Candidate) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.stats["queue_dropped"] += 1

    # lifecycle

    def start(self) -> None:
        if self._worker is None:
            self.agent.rings.observers.append(self.on_ring)
            self.agent.rooms.observers.append(self.on_heard)
            self.agent.tasks.observers.append(self.task_handed)
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="channel")

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            self.agent.rings.observers.remove(self.on_ring)
        with contextlib.suppress(ValueError):
            self.agent.rooms.observers.remove(self.on_heard)
        with contextlib.suppress(ValueError):
            self.agent.tasks.observers.remove(self.task_handed)
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    async def _run(self) -> None:
        while True:
            item = await self.queue.get()
            try:
                await self.handle(item)
            except Exception:
                log.exception("a channel event was not handled")

    # judging and sending

    async def handle(self, item: RingEvent | EnvelopeHeard | Candidate) -> Verdict | None:
        """Judge one event and push it if it passes; the verdict (None: not for the channel)."""
        if isinstance(item, RingEvent):
            candidate = await self._from_ring(item)
        elif isinstance(item, EnvelopeHeard):
            candidate = await self._from_heard(item)
        else:
            candidate = await self._looked_up(item)
        if candidate is None:
            return None
        verdict = judge(candidate, self.me)
        self.stats[f"judged_{verdict.reason}"] += 1
        if not verdict.push:
            return verdict
        if not self.peers:  # no session finished its handshake: the inbox keeps it
            self.stats["no_session"] += 1
            return Verdict(0, verdict.content, "no_session")
        if not self.bucket.take(self.clock()):
            self.held_back += 1
            self.stats["rate_limited"] += 1
            return Verdict(0, verdict.content, "rate_limited")
        content, meta = render(candidate, verdict, self.settings.max_chars)
        if self.held_back:
            content += f"\n({self.held_back} more held back by the rate limit: mesh_read_inbox)"
            self.held_back = 0
        await self.push(content, meta)
        return verdict

    async def push(self, content: str, meta: dict[str, str]) -> None:
        for peer in list(self.peers):
            try:
                await asyncio.wait_for(peer.notify(content, meta), SEND_TIMEOUT_S)
                self.stats["sent"] += 1
            except Exception as exc:  # a closed or stuck session: the others still get it
                self.stats["send_failed"] += 1
                log.info("a channel notification was not delivered: %r", exc)

    async def _looked_up(self, c: Candidate) -> Candidate:
        mate, allowed = await self._standing(c.sender)
        return Candidate(
            c.kind, c.sender, c.room, c.ids, c.summary, c.text, c.proven, c.attested,
            c.addressed, mate, allowed, c.hint,
        )  # fmt: skip

    async def _standing(self, sender: bytes, room: str | None = None) -> tuple[int, int]:
        """(room-mate, allowlisted) for ``sender``; ``room``: a room it just spoke in, attested."""
        allowed = int(self.agent.rings.policy().allows(sender))
        joined = [m.room_topic for m in await self.agent.rooms.transcript.joined_rooms()]
        if room is not None and room != LOBBY_TOPIC and room in joined:
            return 1, allowed
        who = sender.hex()
        for topic in joined:
            recent = await self.agent.rooms.transcript.messages(topic, limit=SCAN_LIMIT)
            if any(m.attested and m.from_hex == who for m in recent):
                return 1, allowed
        return 0, allowed

    async def _from_ring(self, event: RingEvent) -> Candidate | None:
        who = sender_label(event.sender)
        mate, allowed = await self._standing(event.sender)
        ids = {"ring_id": event.ring_id}
        if event.late_answer:
            said = {1: "accepted", 2: "declined"}.get(event.answer, "answered")
            summary = f"{who} {said} your ring {event.ring_id}."
            hint = "mesh_read_inbox shows the room." if event.answer == Answer.ACCEPTED else ""
            return Candidate(
                "answer", event.sender, event.room_topic, ids, summary, event.reason,
                1, 1, 1, mate, allowed, hint,
            )  # fmt: skip
        if event.answer != Answer.DEFERRED:
            return None  # accepted or declined by the policy: nothing waits for the model
        summary = f"{who} rang you and waits for your answer (contact policy ask)."
        hint = f"Answer with mesh_answer_ring ring_id={event.ring_id} answer=1 (accept) or 2."
        return Candidate(
            "ring", event.sender, event.room_topic, ids, summary, event.purpose,
            1, 1, 1, mate, allowed, hint,
        )  # fmt: skip

    async def _from_heard(self, heard: EnvelopeHeard) -> Candidate | None:
        envelope = heard.envelope
        kind = envelope.get("kind")
        if kind not in TALK_KINDS:
            return None  # joins, leaves, openings: nothing to answer
        try:
            sender = bytes.fromhex(str(envelope.get("from")))
        except ValueError:
            return None
        if sender == self.me:
            return None
        text = str(envelope.get("text") or "")
        mine = self.me.hex()
        reply_to = envelope.get("in_reply_to")
        replies = isinstance(reply_to, str) and await self._ours(heard.topic, reply_to)
        listed = mine in (envelope.get("refs") or []) or mine in (
            envelope.get("participants") or []
        )
        addressed = int(bool(replies or listed or mentions(text, self.me)))
        channel_kind: Kind = "message"
        if kind == "task_handed_over":
            channel_kind = "task"
        elif kind in ("answer_given", "result_reported") and replies:
            channel_kind = "answer"
        where = "central" if heard.topic == LOBBY_TOPIC else f"room {heard.topic}"
        verb = {"task": "handed you a task", "answer": "answered you"}.get(
            channel_kind, "wrote to you"
        )
        person = from_person(
            attested=heard.attested, sender_hex=envelope.get("from"),
            message_id=envelope.get("message_id"), room_topic=heard.topic, kind=kind,
            text=envelope.get("text"), refs=_refs(envelope),
        )  # fmt: skip
        who = person_label(sender) if person else sender_label(sender)
        summary = f"{who} {verb} in {where} ({kind})."
        message_id = str(envelope.get("message_id"))
        hint = (
            f"Reply with mesh_say room_topic={heard.topic} in_reply_to={message_id}."
            if heard.topic != LOBBY_TOPIC
            else "mesh_read_inbox has it."
        )
        if not (heard.attested and addressed):
            mate, allowed = 0, 0  # judged out anyway: no lookup for every envelope heard
        else:
            mate, allowed = await self._standing(sender, heard.topic)
        return Candidate(
            channel_kind, sender, heard.topic, {"message_id": message_id}, summary, text,
            0, heard.attested, addressed, mate, allowed, hint, person,
        )  # fmt: skip

    async def _ours(self, topic: str, message_id: str) -> bool:
        recent = await self.agent.rooms.transcript.messages(topic, limit=SCAN_LIMIT)
        return any(m.message_id == message_id and m.from_hex == self.me.hex() for m in recent)


def _refs(envelope: Mapping[str, Any]) -> list[object] | None:
    refs = envelope.get("refs")
    return refs if isinstance(refs, list) else None


_hubs: dict[int, ChannelHub] = {}  # by id(agent): one hub per runtime, while sessions hold it


def _acquire(agent: Agent, settings: ChannelSettings) -> ChannelHub:
    hub = _hubs.get(id(agent))
    if hub is None or hub.agent is not agent:
        hub = _hubs[id(agent)] = ChannelHub(agent, settings)
        hub.start()
    hub.users += 1
    return hub


async def _release(hub: ChannelHub) -> None:
    hub.users -= 1
    if hub.users <= 0:
        if _hubs.get(id(hub.agent)) is hub:
            del _hubs[id(hub.agent)]
        await hub.stop()


def status(agent: Agent) -> dict[str, int]:
    """For ``mesh://status``: sessions pushed to, and what the hub did (counts by outcome)."""
    hub = _hubs.get(id(agent))
    if hub is None or hub.agent is not agent:
        return {"sessions": 0}
    return {
        "sessions": len(hub.peers),
        "held_back": hub.held_back,
        **dict(sorted(hub.stats.items())),
    }


# -- the MCP side -------------------------------------------------------------------------------


class ChannelNotification(Notification[dict[str, Any], Literal["notifications/claude/channel"]]):
    """Claude Code's notification (the SDK's ``ServerNotification`` lists the spec's only)."""


class SessionPeer:
    """An MCP session, pushed to on its standalone stream (never tied to a request)."""

    def __init__(self, session: Any) -> None:
        self.session = session

    async def notify(self, content: str, meta: dict[str, str]) -> None:
        note = ChannelNotification(method=METHOD, params={"content": content, "meta": meta})
        await self.session.send_notification(cast(ServerNotification, note))


class ChannelBinding:
    """One server's (one session's) link to its agent's hub: set by the lifespan (the hub) and
    by the handshake (the session, once ``notifications/initialized`` arrived)."""

    def __init__(self, settings: ChannelSettings) -> None:
        self.settings = settings
        self.hub: ChannelHub | None = None
        self.peer: SessionPeer | None = None
        self.session: Any = None  # the ready session, kept until the hub comes

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        """Server middleware: once the client is ready (it said ``notifications/initialized``,
        or a request other than ``initialize`` was served: the 2026 era has no handshake), this
        session is one to push to, on the connection's standalone stream."""
        result = await call_next(ctx)  # a refused request raises: nothing is bound
        ready = ctx.method == "notifications/initialized" or (
            ctx.request_id is not None and ctx.method != "initialize"
        )
        if ready and self.peer is None:
            self.session = ctx.session  # bound now, or when the hub comes (the runtime opens)
            self._bind()
        return result

    def _bind(self) -> None:
        if self.hub is not None and self.session is not None and self.peer is None:
            self.peer = SessionPeer(self.session)
            self.hub.peers.append(self.peer)

    @contextlib.asynccontextmanager
    async def attached(self, agent: Agent) -> AsyncIterator[ChannelHub]:
        hub = self.hub = _acquire(agent, self.settings)
        self._bind()  # the session was ready before the runtime opened (tools.server.runtime_gate)
        try:
            yield hub
        finally:
            if self.peer is not None:
                with contextlib.suppress(ValueError):
                    hub.peers.remove(self.peer)
            self.hub, self.peer = None, None
            await _release(hub)


def install(app: Any, env: Mapping[str, str]) -> ChannelBinding | None:
    """Declare ``experimental["claude/channel"]`` on ``app`` (an ``MCPServer``) and watch its
    handshake; None (nothing declared) when ``MACULA_MCP_CHANNEL=0``."""
    settings = ChannelSettings.from_env(env)
    if not settings.enabled:
        return None
    lowlevel = app._lowlevel_server  # the SDK declares experimental capabilities only there
    original = lowlevel.get_capabilities

    def get_capabilities(
        notification_options: Any = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> Any:
        declared = {**(experimental_capabilities or {}), CAPABILITY: {}}
        return original(notification_options, declared, extensions, **kwargs)

    lowlevel.get_capabilities = get_capabilities
    binding = ChannelBinding(settings)
    lowlevel.middleware.append(binding)
    return binding


@contextlib.asynccontextmanager
async def attached(binding: ChannelBinding | None, agent: Agent) -> AsyncIterator[None]:
    """For the server's lifespan: this session pushes for ``agent`` while it runs."""
    if binding is None:
        yield
        return
    async with binding.attached(agent):
        yield
