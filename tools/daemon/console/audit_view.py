"""The console's view of the audit trails (``macula.agent.audit``) of the identities this
daemon hosts: the latest entries of each and whether its chain verifies. Read-only.

Invariants:
- only hosted identities' own trails are read (the folder comes from the runtime's trail, never
  from the request); ``limit`` is clamped to 1..``MAX_ENTRIES``;
- files are read and the chain checked off the event loop (``asyncio.to_thread``);
- entries are shown as stored: kinds, outcomes, digests and ids, no content (the trail holds
  none).
"""

from __future__ import annotations

import asyncio
from collections import deque
from pathlib import Path
from typing import Any, Final

from macula.agent.audit import AuditTrail
from macula.agent.audit_verify import verify_trail
from macula.agent.petnames import petname
from macula.store.audit_log import entries
from tools.server.runtime import Runtime

MAX_ENTRIES: Final = 500
DEFAULT_ENTRIES: Final = 100


def read_trail(directory: Path, limit: int) -> dict[str, Any]:
    """The last ``limit`` entries (newest first) and the verdict of ``verify_trail``."""
    latest = deque(entries(directory), maxlen=limit)
    report = verify_trail(directory)
    problem = report.problem
    verdict: dict[str, Any] = (
        {"intact": 1, "checkpoints": report.checkpoints, "notes": report.notes}
        if problem is None
        else {"intact": 0, "problem": problem.kind, "detail": problem.detail, "seq": problem.seq}
    )
    shown = [
        {key: entry.get(key) for key in ("seq", "at_ms", "kind", "outcome", "facts")}
        for entry in reversed(latest)
    ]
    return {"entries": shown, "last_seq": report.last_seq, "verified": verdict}


async def audit_view(runtimes: list[Runtime], limit: int = DEFAULT_ENTRIES) -> dict[str, Any]:
    """Every hosted identity's trail, sorted by node id."""
    wanted = max(1, min(limit, MAX_ENTRIES))
    trails = []
    for runtime in sorted(runtimes, key=lambda r: r.node.identity.node_id):
        node_id = runtime.node.identity.node_id
        view: dict[str, Any] = {"node_id": node_id.hex(), "petname": petname(node_id)}
        trail = runtime.agent.audit
        if isinstance(trail, AuditTrail):
            view |= {"recorded": 1} | await asyncio.to_thread(read_trail, trail.directory, wanted)
        else:
            view |= {"recorded": 0, "entries": []}
        trails.append(view)
    return {"trails": trails}
