"""The approval queue, agent side (issue 39): what waits for the owner, and acting on decisions.

The owner's settings are the ``[approvals]`` table of ``$MACULA_HOME/owner.toml`` (keys
``tasks_from_strangers``, ``rings_when_asked`` (0/1), ``ttl_s``, ``max_pending``), overridden
key by key by ``[agents.<MACULA_MCP_AGENT>.approvals]``. The file's other tables belong to the
capability switches (``tools.owner``); this module reads only its own.

Invariants:
- ``load_settings`` never raises. A missing file or table means the defaults (nothing held:
  today's behaviour). A file that cannot be read or parsed, or an ``[approvals]`` table with
  an unknown key or a bad value, fails closed: everything that can need approval needs it,
  and ``error`` names the file and the key (logged once per distinct problem, on stderr).
- The settings are read again when the file changes (its mtime and size), so a change takes
  effect without a restart.
- Items are held in ``macula.store.approvals``; the decision comes from the owner's CLI (maybe
  another process: the shared SQLite file) or the console (in process: ``decide`` kicks).
  ``run`` applies every decision, turns items past their TTL ``expired`` and applies those too,
  each exactly once (``applied``), through the applier registered for its kind.
- ``run`` polls the store only while items of this agent are pending (``poll_s``); idle, it
  sleeps until ``kick`` or the next expiry.
- ``audit`` is the one hook the audit trail is wired to (``audited_by``): called with
  ``queued``, ``approved``, ``denied``, ``expired`` (as the decision is applied) or
  ``withdrawn`` (a held task its sender canceled) and the item, its content stripped. The
  trail records the owner's decisions and expiries (``owner_decided``); ``queued`` is already
  there as the outcome of the ``task_received``/``ring_received``/``call_received`` it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from macula.agent.audit import Recorder, outside_fact
from macula.agent.envelope import is_id
from macula.agent.petnames import petname
from macula.config import OWNER_FILE
from macula.store.approvals import ApprovalError, ApprovalStore, Item, Kind, content_size

log = logging.getLogger("macula.agent.approvals")

DEFAULT_TTL_S: Final = 24 * 3600
DEFAULT_MAX_PENDING: Final = 100
TTL_RANGE: Final = (10, 30 * 24 * 3600)
MAX_PENDING_RANGE: Final = (1, 10_000)
FLAGS: Final = ("tasks_from_strangers", "rings_when_asked", "served_calls")
POLL_S: Final = 0.5
PER_SENDER_SHARE: Final = 10  # one sender may fill at most a tenth of the queue (at least 1)
OWNER_FILE_NAME: Final = OWNER_FILE


@dataclass(frozen=True, slots=True)
class ApprovalSettings:
    tasks_from_strangers: int = 0  # 1: a task from outside the contact allowlist waits
    rings_when_asked: int = 0  # 1: a ring under contact policy ``ask`` waits for the owner
    served_calls: int = 0  # 1: every call of a served procedure waits, whatever allow= says
    ttl_s: int = DEFAULT_TTL_S
    max_pending: int = DEFAULT_MAX_PENDING
    error: str | None = None  # set: the file is malformed and these settings fail closed


def _check(table: Mapping[str, Any], where: str, into: dict[str, int], problems: list[str]) -> None:
    for key, value in table.items():
        if key in FLAGS:
            ok = type(value) is bool or (type(value) is int and value in (0, 1))
            if ok:
                into[key] = int(value)
            else:
                problems.append(f"{where} {key}: expected 0 or 1, got {value!r}")
        elif key in ("ttl_s", "max_pending"):
            low, high = TTL_RANGE if key == "ttl_s" else MAX_PENDING_RANGE
            if type(value) is int and low <= value <= high:
                into[key] = value
            else:
                problems.append(f"{where} {key}: expected an integer {low}..{high}, got {value!r}")
        else:
            problems.append(
                f"{where} {key}: unknown key (known: {', '.join((*FLAGS, 'ttl_s', 'max_pending'))})"
            )


def parse_settings(data: Mapping[str, Any], agent: str | None) -> tuple[dict[str, int], list[str]]:
    """The ``[approvals]`` values of a parsed owner file (with the agent's overrides) and
    every problem found, each naming its table and key."""
    values: dict[str, int] = {}
    problems: list[str] = []
    tables: list[tuple[str, Any]] = [("[approvals]", data.get("approvals"))]
    agents = data.get("agents")
    if agent is not None and isinstance(agents, Mapping):
        own = agents.get(agent)
        if isinstance(own, Mapping):
            tables.append((f"[agents.{agent}.approvals]", own.get("approvals")))
    for where, table in tables:
        if table is None:
            continue
        if not isinstance(table, Mapping):
            problems.append(f"{where}: expected a table, got {type(table).__name__}")
            continue
        _check(table, where, values, problems)
    return values, problems


def load_settings(path: Path, agent: str | None) -> ApprovalSettings:
    """The approval settings of ``path`` for ``agent`` (see the module invariants)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ApprovalSettings()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return _closed({}, f"{path}: cannot be read as TOML: {exc}")
    values, problems = parse_settings(data, agent)
    if problems:
        return _closed(values, f"{path}: " + "; ".join(problems))
    return _settings(values)


def _settings(values: dict[str, int], error: str | None = None) -> ApprovalSettings:
    return ApprovalSettings(
        tasks_from_strangers=values.get("tasks_from_strangers", 0),
        rings_when_asked=values.get("rings_when_asked", 0),
        served_calls=values.get("served_calls", 0),
        ttl_s=values.get("ttl_s", DEFAULT_TTL_S),
        max_pending=values.get("max_pending", DEFAULT_MAX_PENDING),
        error=error,
    )


def _closed(values: dict[str, int], error: str) -> ApprovalSettings:
    """Fail closed: every flag on, valid numbers kept."""
    return _settings({**values, **dict.fromkeys(FLAGS, 1)}, error)


def audit_event(event: str, item: Item) -> None:
    """No trail: the hook of an ``Approvals`` built without one."""
    return None


def audited_by(trail: Recorder) -> Callable[[str, Item], None]:
    """The hook writing the owner's decisions into ``trail`` (``owner_decided``: approved,
    denied, expired or withdrawn, with who decided, never the content)."""

    def record(event: str, item: Item) -> None:
        if event == "queued":
            return  # the inbound entry that held it says queued
        trail.record(
            "owner_decided",
            event,
            item_kind=item.kind,
            sender=item.sender.hex(),
            by=item.decided_by or ("sender" if event == "withdrawn" else "clock"),
            **outside_fact(trail, "approval_id", item.approval_id, is_id(item.approval_id)),
        )

    return record


Applier = Callable[[Item], Awaitable[Any]]  # acts on a decided item; returns a kept result


class Approvals:
    """One agent's approval queue: hold items, read decisions, apply them."""

    def __init__(
        self,
        me: bytes,
        store: ApprovalStore,
        clock: Callable[[], int],
        *,
        settings_file: Path,
        agent_name: str | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
        poll_s: float = POLL_S,
    ) -> None:
        self.me = me
        self.store = store
        self.clock = clock
        self.settings_file = settings_file
        self.agent_name = agent_name
        self.random = random_bytes
        self.poll_s = poll_s
        self.appliers: dict[Kind, Applier] = {}
        self.kick = asyncio.Event()
        self.audit: Callable[[str, Item], None] = audit_event
        self._settings: tuple[bytes | None, ApprovalSettings] | None = None
        self._logged: str | None = None

    def settings(self) -> ApprovalSettings:
        """The settings in force, read again when the file changed."""
        try:  # the content, not (mtime, size): an edit within one timestamp tick counts too
            with self.settings_file.open("rb") as held:
                seen: bytes | None = hashlib.sha256(held.read()).digest()
        except OSError:
            seen = None
        if self._settings is None or self._settings[0] != seen:
            loaded = load_settings(self.settings_file, self.agent_name)
            self._settings = (seen, loaded)
            if loaded.error is not None and loaded.error != self._logged:
                log.warning("owner settings malformed, approvals fail closed: %s", loaded.error)
            self._logged = loaded.error
        return self._settings[1]

    async def hold(self, kind: Kind, sender: bytes, ref: str, content: Any) -> Item:
        """Queue an item (or find the one already held for ``(kind, sender, ref)``).
        ``ApprovalError`` (``approval_queue_full``) when the queue is full."""
        settings = self.settings()
        now = self.clock()
        item = Item(
            approval_id=self.random(8).hex(),
            owner=self.me,
            kind=kind,
            sender=sender,
            petname=petname(sender),
            ref=ref,
            size=content_size(content),
            received_ms=now,
            expires_ms=now + settings.ttl_s * 1000,
            content=content,
        )
        held = await self.store.add(
            item,
            max_pending=settings.max_pending,
            max_per_sender=max(1, settings.max_pending // PER_SENDER_SHARE),
        )
        if held.approval_id == item.approval_id:
            self.note_event("queued", held)
            self.kick.set()
        return held

    async def find(self, kind: Kind, sender: bytes, ref: str) -> Item | None:
        return await self.store.find(self.me, kind, sender, ref)

    async def pending(self, *, limit: int = 50, offset: int = 0) -> list[Item]:
        return await self.store.pending(self.me, self.clock(), limit=limit, offset=offset)

    async def count_pending(self) -> int:
        return await self.store.count_pending(self.me, self.clock())

    async def decide(
        self, approval_id: str, decision: str, *, by: str, reason: str | None = None
    ) -> Item:
        """The owner's decision, from the console (in process); applied at once by ``run``."""
        item = await self.store.get(approval_id)
        if item is None or item.owner != self.me:
            raise ApprovalError(
                "not_found", f"no approval item {approval_id} here", "list the pending items"
            )
        decided = await self.store.decide(approval_id, decision, self.clock(), by=by, reason=reason)
        self.kick.set()
        return decided

    async def run(self) -> None:
        """Apply decisions and expiries, forever (see the module invariants)."""
        while True:
            self.kick.clear()
            try:
                await self.apply_due()
                timeout = await self._sleep_for()
            except Exception:  # never take the agent's task group down
                log.exception("approval queue failed; retrying")
                timeout = self.poll_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout)

    async def apply_due(self) -> int:
        """Expire what is past its TTL, then apply every decision not applied yet."""
        now = self.clock()
        await self.store.expire(self.me, now)
        done = 0
        while items := await self.store.to_apply(self.me):
            for item in items:
                await self._apply(item)
                done += 1
        if done:
            await self.store.prune(self.me, now)
        return done

    async def _apply(self, item: Item) -> None:
        applier = self.appliers.get(item.kind)
        result: Any = None
        if applier is not None:
            try:
                result = await applier(item)
            except Exception:  # the decision stays recorded; its effect failed once, logged
                log.exception("applying approval %s (%s) failed", item.approval_id, item.kind)
                result = {"code": "apply_failed", "detail": "the decision could not be applied"}
        await self.store.applied(item.approval_id, result)
        self.note_event(item.state, replace(item, content=None))

    async def _sleep_for(self) -> float | None:
        if await self.store.count_pending(self.me, self.clock()) > 0:
            return self.poll_s  # a decision may come from another process: look again soon
        if await self.store.to_apply(self.me, limit=1):
            return 0.0  # decided (by another process) after apply_due read: apply it now
        expiry = await self.store.next_expiry_ms(self.me)
        if expiry is None:
            return None
        return max(0.05, (expiry - self.clock()) / 1000)

    def note_event(self, event: str, item: Item) -> None:
        """Tell the audit hook (content stripped); its failure never stops a decision."""
        try:
            self.audit(event, replace(item, content=None))
        except Exception:  # the audit trail failing never stops a decision
            log.exception("the approvals audit hook failed")


def refusal_note(item: Item) -> str:
    """The note the sender gets for a denied or expired item: it starts ``refused:``."""
    if item.state == "expired":
        return "refused: the owner did not decide in time (approval expired)"
    reason = f": {item.reason}" if item.reason else ""
    return f"refused: owner denied{reason}"
