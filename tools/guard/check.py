"""What the ``pre-commit`` hook asks: may this commit go, given the reservations on the station?

Invariants:
- Refused (exit 1) only when a staged path is covered by an unexpired exclusive reservation of
  another holder than this home's identity; the message names the holder (petname and the name
  it gave), the reserved path, the expiry and the reason, and says ``git commit --no-verify``.
- Paths this identity holds, shared reservations and expired ones pass.
- The station unreachable, or any error asking it: a warning and exit 0 (fail open), or with
  ``fail_closed`` a refusal (exit 1). A repository fault (no origin, git failing) is the same.
- The station is asked by a throwaway identity (the agent's own connection, if it runs, is not
  disturbed); "this agent" is the identity of ``MACULA_HOME`` (``macula.config``), compared by
  node id. Bounded: at most ``MAX_PAGES`` pages, ``timeout`` seconds in all.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from macula.agent.petnames import petname
from macula.client.backoff import Backoff
from macula.config import (
    configured_stations,
    identity_from_env,
    known_stations_from_env,
    macula_home,
)
from macula.errors import MaculaError
from macula.node.node import Node
from macula.services.house_client import HouseClient
from macula.services.limits import MAX_RESERVATIONS_PAGE
from macula.services.reservation_paths import PathRefused, matches
from macula.stations import StationAddress, parse_station
from macula.wire.identity import Identity
from tools.guard.project import GitError, project_id, project_of, staged_paths

__all__ = ["Verdict", "blockers", "check"]

DEFAULT_TIMEOUT_S: Final = 8.0
CONNECT_TIMEOUT_S: Final = 2.0  # the first station handshake; unreachable: fail open or closed
MAX_PAGES: Final = 20
OVERRIDE: Final = "override for this commit (a person's call): git commit --no-verify"


@dataclass(frozen=True)
class Verdict:
    code: int  # the hook's exit status: 0 the commit goes on, 1 refused
    message: str  # for stderr; empty when there is nothing to say


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def blockers(
    staged: Sequence[str], reservations: Sequence[Mapping[str, Any]], me: bytes, now_ms: int
) -> list[str]:
    """One line for each staged path another holder reserved exclusively (and unexpired)."""
    lines = []
    for row in reservations:
        if row.get("holder") == me.hex() or not row.get("exclusive"):
            continue
        if int(row.get("expires_ms", 0)) <= now_ms:
            continue
        glob = str(row.get("path", ""))
        hit = [path for path in staged if matches(glob, path)]
        if not hit:
            continue
        try:
            who = petname(bytes.fromhex(str(row.get("holder"))))
        except ValueError:
            who = str(row.get("holder"))[:16]
        name = f" ({row['holder_name']})" if row.get("holder_name") else ""
        reason = row.get("reason") or "no reason given"
        lines.append(
            f"  {', '.join(hit[:5])}{' ...' if len(hit) > 5 else ''}: reserved as {glob}"
            f" exclusively by {who}{name} until {_when(int(row.get('expires_ms', 0)))}: {reason}"
        )
    return lines


def _stations(env: Mapping[str, str]) -> list[StationAddress]:
    configured = configured_stations(env)
    if configured:
        return configured
    from tools.local_station.station import local_station_status

    status = local_station_status(macula_home(env))
    if status.state != "running" or not status.endpoint:
        raise MaculaError("no station configured and this home's local station is not running")
    return [parse_station(status.endpoint)]


async def _reservations(
    env: Mapping[str, str], project: str, realm: str | None
) -> tuple[list[dict[str, Any]], int]:
    """Every live reservation of ``project``, and the station's clock when it answered."""
    identity = Identity.generate(os.urandom, difficulty=0)
    node = Node(
        identity,
        _stations(env),
        known_stations=known_stations_from_env(env),
        connect_timeout=CONNECT_TIMEOUT_S,
        backoff=Backoff(first_connect_attempts=1),  # one round of the stations, then say so
    )
    rows: list[dict[str, Any]] = []
    now_ms = 0
    async with node:
        house = HouseClient(node, node.dht, identity, timeout=DEFAULT_TIMEOUT_S / 2)
        after = 0
        for _ in range(MAX_PAGES):
            page = await house.list_reservations(
                project, realm=realm, after_id=after, limit=MAX_RESERVATIONS_PAGE
            )
            got = [dict(r) for r in page.get("reservations") or [] if isinstance(r, dict)]
            rows += got
            now_ms = int(page.get("now_ms", now_ms))
            if not got or not page.get("remaining"):
                break
            after = int(got[-1].get("id", 0))
    return rows, now_ms


def _unreachable(why: str, fail_closed: int) -> Verdict:
    if fail_closed:
        return Verdict(1, f"macula guard: commit refused (--fail-closed): {why}\n{OVERRIDE}")
    return Verdict(0, f"macula guard: warning: not checked ({why}); the commit goes on")


async def check(
    root: Path,
    env: Mapping[str, str],
    *,
    fail_closed: int = 0,
    project: str | None = None,
    realm: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Verdict:
    """The verdict on the commit staged in the repository at ``root``."""
    try:
        staged = staged_paths(root)
        if not staged:
            return Verdict(0, "")
        scope = project_id(project) if project else project_of(root)
    except (GitError, PathRefused) as exc:
        return _unreachable(str(exc), fail_closed)
    try:
        me = identity_from_env(env).node_id
        rows, now_ms = await asyncio.wait_for(_reservations(env, scope, realm), timeout)
    except (MaculaError, OSError, TimeoutError) as exc:
        why = str(exc) or type(exc).__name__
        return _unreachable(f"the station could not be asked: {why}", fail_closed)
    lines = blockers(staged, rows, me, now_ms)
    if not lines:
        return Verdict(0, "")
    said = "\n".join(lines)
    return Verdict(
        1,
        f"macula guard: commit refused: paths reserved by another agent in {scope}:\n{said}\n"
        f"ask them (mesh_ring), wait for the expiry, or unstage those paths; {OVERRIDE}",
    )
