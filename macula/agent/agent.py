"""``Agent``: the agent layer on one ``Node`` — presence, rooms, rings, and their stores.

``async with Agent(node, settings) as agent:`` opens the local stores and taps nothing yet.
Presence starts on the first mesh use (``ensure_present``), never from serving alone; after
an explicit ``goodbye`` only an explicit ``hello`` restarts it. Starting presence also taps
central and every room we are in, and serves ``agent.<node_id>.ring`` unless
``MACULA_MCP_NO_RING=1``. Every background task belongs to the agent's task group. When the node
fails over to another station, a present agent says hello there at once and registers in
that station's directory (``Node.on_station``).
What ``__aenter__`` opens is held by one exit stack: a failing step closes what came before,
and ``__aexit__`` winds down (goodbye, taps) before the task group and then the stores close.
The transcript and the rings table are bounded (``transcript_bounds``, ``rings_bounds``: env
``MACULA_MCP_{TRANSCRIPT,RINGS}_MAX_ROWS`` and ``..._MAX_AGE_DAYS``), pruned once on opening and
then by the stores themselves as rows arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from macula.agent.approvals import Approvals, audited_by
from macula.agent.audit import NO_TRAIL, AuditSettings, AuditTrail, Recorder
from macula.agent.contact_policy import trust, untrust
from macula.agent.envelope import LOBBY_TOPIC
from macula.agent.petnames import petname, resolve
from macula.agent.presence import DEFAULT_INTERVAL_S, Presence, Profile
from macula.agent.rings import Rings
from macula.agent.room.keys import RoomKeys
from macula.agent.room.outbox import RoomOutbox
from macula.agent.room.rooms import DEFAULT_MAX_ROOMS, Rooms, RoomThread
from macula.agent.task_messages import TaskLimits
from macula.agent.tasks import Tasks
from macula.client.station_choice import StationInfo
from macula.clock import MsClock, now_ms
from macula.config import (
    AGENT_ENV,
    CONTACT_POLICY_ENV,
    CONTACT_POLICY_FILE_ENV,
    HELLO_MESSAGE_ENV,
    MODEL_ENV,
    NO_CITIZENSHIP_ENV,
    NO_RING_ENV,
    OPERATOR_NAME_ENV,
    OWNER_FILE,
    TASKS_DB_ENV,
    bounds_env,
    flag_setting,
    macula_home,
    path_setting,
    positive_int_setting,
    text_setting,
)
from macula.errors import ConfigError, MaculaError
from macula.node.node import Node
from macula.services.house_client import DIRECTORY_RENEW_S, HouseClient
from macula.store import rings as ring_store
from macula.store import transcript as transcript_store
from macula.store.approvals import ApprovalStore
from macula.store.base import DAY_MS, Bounds, StorePaths, paths_from_env
from macula.store.rings import Ring, RingStore
from macula.store.room_keys import RoomKeyStore, room_keys_path
from macula.store.room_outbox import RoomOutboxStore, room_outbox_path
from macula.store.roster import RosterStore
from macula.store.tasks import TaskStore
from macula.store.transcript import TranscriptMessage, TranscriptStore


@dataclass(frozen=True)
class AgentSettings:
    paths: StorePaths
    policy_file: Path
    profile: Profile = field(default_factory=Profile)
    policy_override: str | None = None
    serve_rings: bool = True
    max_rooms: int = DEFAULT_MAX_ROOMS
    citizenship: bool = True  # register in the station's agent directory while present
    transcript_bounds: Bounds = transcript_store.DEFAULT_BOUNDS  # rows per room, age
    rings_bounds: Bounds = ring_store.DEFAULT_BOUNDS
    tasks_db: Path | None = None  # MACULA_MCP_TASKS_DB; default tasks.sqlite3 beside rings
    task_limits: TaskLimits = field(default_factory=TaskLimits)  # MACULA_MCP_TASKS_*
    audit: AuditSettings = field(
        default_factory=AuditSettings.off
    )  # the trail (macula.agent.audit); None: off
    owner_file: Path | None = None  # $MACULA_HOME/owner.toml: [approvals] (issue 39)
    agent_name: str | None = None  # MACULA_MCP_AGENT: its [agents.<name>.approvals] apply

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentSettings:
        env = os.environ if environ is None else environ
        paths = paths_from_env(env)
        home = macula_home(env)
        raw_policy = env.get(CONTACT_POLICY_FILE_ENV)
        if raw_policy is not None and not raw_policy.strip():
            raise ConfigError(f"{CONTACT_POLICY_FILE_ENV} is set but empty")
        no_ring = flag_setting(env, NO_RING_ENV)
        no_citizenship = flag_setting(env, NO_CITIZENSHIP_ENV)
        profile = Profile(
            operator_name=text_setting(env, OPERATOR_NAME_ENV),
            message=text_setting(env, HELLO_MESSAGE_ENV),
            model=text_setting(env, MODEL_ENV),
            interval_seconds=DEFAULT_INTERVAL_S,
        )
        return cls(
            paths=paths,
            policy_file=Path(raw_policy).expanduser()
            if raw_policy
            else home / "contact_policy.json",
            profile=profile,
            policy_override=text_setting(env, CONTACT_POLICY_ENV),
            serve_rings=not no_ring,
            citizenship=not no_citizenship,
            transcript_bounds=_bounds_from_env(env, "TRANSCRIPT", transcript_store.DEFAULT_BOUNDS),
            rings_bounds=_bounds_from_env(env, "RINGS", ring_store.DEFAULT_BOUNDS),
            tasks_db=path_setting(env, TASKS_DB_ENV, "a database file path"),
            task_limits=TaskLimits.from_env(env),
            audit=AuditSettings.from_env(env),
            owner_file=home / OWNER_FILE,
            agent_name=text_setting(env, AGENT_ENV),
        )


def _bounds_from_env(env: Mapping[str, str], store: str, default: Bounds) -> Bounds:
    """``MACULA_MCP_<store>_MAX_ROWS`` and ``MACULA_MCP_<store>_MAX_AGE_DAYS`` over ``default``."""
    rows = positive_int_setting(env, bounds_env(store, "MAX_ROWS"), default.max_rows)
    days = positive_int_setting(
        env, bounds_env(store, "MAX_AGE_DAYS"), default.max_age_ms // DAY_MS
    )
    return replace(default, max_rows=rows, max_age_ms=days * DAY_MS)


@dataclass(frozen=True, slots=True)
class Inbox:
    """What waits for the model: its rooms threaded, help on central, rings deferred to it."""

    rooms: list[RoomThread]
    central_help: list[TranscriptMessage]
    pending_rings: list[Ring]


class Agent:
    def __init__(self, node: Node, settings: AgentSettings, *, clock: MsClock = now_ms) -> None:
        self.node = node
        self.settings = settings
        self.clock = clock
        self._group: asyncio.TaskGroup | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._roster: RosterStore | None = None
        self._transcript: TranscriptStore | None = None
        self._rings: RingStore | None = None
        self.presence: Presence
        self.rooms: Rooms
        self.rings: Rings
        self.tasks: Tasks
        self.approvals: Approvals
        self._approving: asyncio.Task[None]
        self._lock = asyncio.Lock()
        self.house = HouseClient(node, node.dht, node.identity)
        self._citizen: asyncio.Task[None] | None = None
        self.directory_error: str | None = None
        self._watching_station = False
        self.audit: Recorder = NO_TRAIL  # what it did and what was done to it (the owner's)

    async def __aenter__(self) -> Agent:
        paths = self.settings.paths
        async with contextlib.AsyncExitStack() as stack:
            trail = AuditTrail.open(self.settings.audit, self.node.identity, self.clock)
            stack.callback(trail.close)  # closed last: a checkpoint signs what the agent did
            self.audit = trail
            self._roster = await stack.enter_async_context(await RosterStore.open(paths.roster))
            self._transcript = await stack.enter_async_context(
                await TranscriptStore.open(paths.transcript)
            )
            self._rings = await stack.enter_async_context(await RingStore.open(paths.rings))
            room_keys = await stack.enter_async_context(
                await RoomKeyStore.open(room_keys_path(paths.transcript))
            )
            self._transcript.bounds = self.settings.transcript_bounds
            self._rings.bounds = self.settings.rings_bounds
            await self._transcript.prune(self.clock())
            await self._rings.prune(self.clock())
            self.presence = Presence(self.node, self._roster, self.settings.profile, self.clock)
            self.rooms = Rooms(
                self.node, self._transcript, self.clock, max_rooms=self.settings.max_rooms
            )
            self.rooms.keys = RoomKeys(self.node.identity, room_keys, self.clock)
            outbox = await stack.enter_async_context(
                await RoomOutboxStore.open(room_outbox_path(paths.transcript))
            )
            self.rooms.outbox = RoomOutbox(self.node, outbox, self.clock)
            self.rings = Rings(
                self.node,
                self._rings,
                self.rooms,
                self.clock,
                policy_file=self.settings.policy_file,
                policy_override=self.settings.policy_override,
            )
            self.rings.audit = trail
            tasks_db = self.settings.tasks_db or paths.rings.with_name("tasks.sqlite3")
            task_store = await stack.enter_async_context(await TaskStore.open(tasks_db))
            await task_store.prune(self.node.identity.node_id, self.clock())
            approval_store = await stack.enter_async_context(
                await ApprovalStore.open(paths.rings.with_name("approvals.sqlite3"))
            )
            self.approvals = Approvals(
                self.node.identity.node_id,
                approval_store,
                self.clock,
                settings_file=self.settings.owner_file or Path(os.devnull),
                agent_name=self.settings.agent_name,
            )
            self.approvals.audit = audited_by(trail)  # the owner's decisions, in the trail
            self.approvals.settings()  # a malformed [approvals] is named on stderr at start
            self.tasks = Tasks(
                self.node,
                task_store,
                self.clock,
                policy=self.rings.policy,
                limits=self.settings.task_limits,
                approvals=self.approvals,
            )
            self.tasks.audit = trail
            self.rings.hold_for_owner(self.approvals)
            self._group = await stack.enter_async_context(asyncio.TaskGroup())
            self._approving = self._group.create_task(self.approvals.run())
            stack.push_async_callback(self._wind_down)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _wind_down(self) -> None:
        """Say goodbye if present and stop every task, so the task group can close."""
        if self.presence.present:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.goodbye(keep_queued=1), 1.5)
        if self._citizen is not None:
            self._citizen.cancel()
            self._citizen = None
        await self.presence.stop_tasks()
        await self.rooms.stop()
        await self.tasks.stop()
        self._approving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._approving
        self._group = None

    def _moved(self, info: StationInfo) -> None:
        """The node failed over: the agents of the new station have not heard of us. Say
        hello there now, not at the next heartbeat, and register in its directory."""
        if self._group is not None and self.presence.present:
            self._group.create_task(self._reannounce())

    async def _reannounce(self) -> None:
        with contextlib.suppress(MaculaError):
            await self.presence.beat()
        if self._citizen is not None and self._group is not None:
            self._citizen.cancel()
            self._citizen = self._group.create_task(self._citizenship())

    @property
    def group(self) -> asyncio.TaskGroup:
        assert self._group is not None, "agent not started"
        return self._group

    async def ensure_present(self) -> None:
        """Start presence on first mesh use, unless this agent said goodbye."""
        if self.presence.present or self.presence.said_goodbye:
            return
        await self.hello()

    async def hello(self, realm: bytes | None = None, **profile_changes: Any) -> dict[str, Any]:
        """Announce this agent (or re-announce with new fields) and start everything presence
        brings: heartbeat, roster feed, taps on central and our rooms, the ring endpoint.
        ``realm``: say hello in that realm's lobby from now on (default: where we are)."""
        async with self._lock:
            profile = self.presence.with_profile(**profile_changes)
            if not self._watching_station:  # once present, a failover re-announces us
                self.node.on_station(self._moved)
                self._watching_station = True
            await self.presence.start(self.group, profile, realm)
            await self.rooms.start(self.group)
            if self.settings.serve_rings and not self.rings.serving:
                await self.rings.serve()
            if not self.tasks.serving:
                await self.tasks.serve(self.group)
            if self.settings.citizenship and self._citizen is None:
                self._citizen = self.group.create_task(self._citizenship())
            with contextlib.suppress(MaculaError):  # on return we are reachable: rings, taps
                await self.node.flush(timeout=5)
        return self.identity_view()

    def directory_entry(self) -> dict[str, Any]:
        profile = self.presence.profile
        entry: dict[str, Any] = {"petname": petname(self.node.identity.node_id)}
        for name in ("operator_name", "session_name", "model", "connected_via"):
            value = getattr(profile, name)
            if value:
                entry[name] = value
        offers = list(self.rings.policy().offers)
        if offers:
            entry["offers"] = offers
        return entry

    async def _citizenship(self) -> None:
        """Register in the agent directory now and every 5 minutes (entries live 20)."""
        while True:
            try:
                await self.house.register_agent(self.directory_entry())
                self.directory_error = None
            except MaculaError as exc:  # no directory here, or it refused: roster still works
                self.directory_error = str(exc)
            await asyncio.sleep(DIRECTORY_RENEW_S)

    async def goodbye(self, *, keep_queued: int = 0) -> dict[str, Any]:
        """Leave every room (closing those we opened), say goodbye once, stop presence.
        Queued room messages are sent first when connected, else dropped and counted
        (``keep_queued`` 1, when the process shuts down: kept for its next run)."""
        left = []
        outbox = self.rooms.outbox
        dropped = 0 if outbox is None else await outbox.settle(LOBBY_TOPIC, drop=1 - keep_queued)
        for membership in await self.rooms.transcript.joined_rooms():
            with contextlib.suppress(Exception):
                gone = await self.rooms.leave(
                    membership.room_topic,
                    close=int(membership.role == "opener"),
                    keep_queued=keep_queued,
                )
                left.append(membership.room_topic)
                dropped += gone.outbox_dropped
        if self._citizen is not None:
            self._citizen.cancel()
            self._citizen = None
            with contextlib.suppress(MaculaError):
                await self.house.remove_agent()
        await self.presence.goodbye()
        await self.rooms.stop()
        if self.rings.serving:
            await self.rings.unserve()
        if self.tasks.serving:
            await self.tasks.unserve()
        me = self.node.identity.node_id.hex()
        return {"node_id": me, "rooms_left": left, "present": 0, "outbox_dropped": dropped}

    async def agents(self, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
        """Who is present: the roster (heard hellos) merged with the agent directory (the
        station's, merged there with its linked stations'), so a fresh session sees registered
        agents before their next hello. ``source`` says where each row came from: roster,
        directory or both; ``station`` (directory rows) where the agent registered, ``relayed``
        1 when that is a linked station (its row checked against the agent's signature)."""
        rows: dict[str, dict[str, Any]] = {}
        for heard in await self.presence.agents(500, 0):
            row = asdict(heard)
            row["node_id"] = heard.node_id.hex()
            row["petname"] = petname(heard.node_id)
            row["source"] = "roster"
            rows[row["node_id"]] = row
        try:
            listed = await self.house.list_agents()
        except MaculaError:
            listed = []
        for entry in listed:
            node = entry.get("node_id")
            if not isinstance(node, str):
                continue
            if node in rows:
                rows[node]["source"] = "both"
                rows[node].setdefault("offers", entry.get("offers"))
                rows[node].setdefault("station", entry.get("station"))
                rows[node].setdefault("relayed", entry.get("relayed"))
            else:
                rows[node] = {
                    **entry,
                    "source": "directory",
                    "stale": 0,
                    "last_seen_ms": entry.get("registered_ms"),
                }
        ordered = sorted(rows.values(), key=lambda r: r.get("last_seen_ms") or 0, reverse=True)
        return ordered[offset : offset + limit]

    async def resolve(self, name_or_hex: str) -> bytes:
        """A node id from 64 hex or a petname seen in our own roster."""
        return resolve(name_or_hex, await self.presence.roster.node_ids())

    async def trust(self, name_or_hex: str) -> dict[str, Any]:
        """Add a peer (node id or a petname from our roster) to the contact allowlist."""
        node_id = await self.resolve(name_or_hex)
        state = trust(
            self.settings.policy_file, node_id, env_override=self.settings.policy_override
        )
        return {
            "node_id": node_id.hex(),
            "petname": petname(node_id),
            "contact_policy": state.mode.label,
        }

    async def untrust(self, name_or_hex: str) -> dict[str, Any]:
        node_id = await self.resolve(name_or_hex)
        state = untrust(
            self.settings.policy_file, node_id, env_override=self.settings.policy_override
        )
        return {
            "node_id": node_id.hex(),
            "petname": petname(node_id),
            "contact_policy": state.mode.label,
        }

    async def inbox(self) -> Inbox:
        rooms = await self.rooms.inbox()
        return Inbox(rooms.rooms, rooms.central_help, await self.rings.pending())

    def identity_view(self) -> dict[str, Any]:
        policy = self.rings.policy()
        return {
            "node_id": self.node.identity.node_id.hex(),
            "petname": petname(self.node.identity.node_id),
            "present": int(self.presence.present),
            "ring": {
                "serving": int(self.rings.serving),
                "contact_policy": policy.mode.label,
                "policy_error": policy.error,
            },
            "profile": {k: v for k, v in asdict(self.presence.profile).items() if v is not None},
        }
