"""The owner's acts told to the audit trail (``macula.agent.audit``).

Invariants:
- a policy change is written into the trail of every agent it touches: the named agent's
  (``agents/<name>.key``), or for a change of the home's switches every agent of this home
  that already keeps a trail (keys under ``agents/`` and ``sessions/``), as ``policy_changed``
  with the switch, digests of the file before and after (never its contents) and who (``cli``,
  ``console``);
- it never raises: a key that cannot be read is skipped and logged (the change itself is
  already written; the trail says what it can);
- with the trail off (``MACULA_MCP_NO_AUDIT=1``) it writes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from macula.agent.audit import AuditSettings, audit_dir, record_once
from macula.keyfile import KeyFileError, load_identity
from macula.wire.identity import Identity

log = logging.getLogger("macula.tools.owner")


def _touched(home: Path, agent: str | None) -> Iterator[Identity]:
    """The identities whose trail a change of ``agent``'s (or the home's) switches concerns."""
    if agent is not None:
        keys = [home / "agents" / f"{agent}.key"]
    else:
        keys = sorted((home / "agents").glob("*.key")) + sorted((home / "sessions").glob("*.key"))
    for key in keys:
        if not key.is_file():
            continue
        try:
            identity = load_identity(key)
        except (KeyFileError, OSError) as exc:
            log.warning("audit: policy change not recorded for %s: %s", key.name, exc)
            continue
        if agent is not None or audit_dir(home, identity.node_id).is_dir():
            yield identity


def policy_changed_event(
    *,
    by: str,
    path: str,
    agent: str | None,
    change: str,
    before: str,
    after: str,
    env: Mapping[str, str] | None = None,
) -> int:
    """Record one policy change (``change``: the switch as text, ``tools.mesh_serve=0``,
    ``preset talk``; ``before``/``after``: digests of the file) in each touched trail of the
    home that holds ``path``; how many trails took it."""
    settings = AuditSettings.from_env(os.environ if env is None else env)
    if settings.home is None:
        return 0
    home = Path(path).parent
    settings = dataclasses.replace(settings, home=home)
    written = 0
    for identity in _touched(home, agent):
        facts: dict[str, str | int] = {"switch": change, "old": before, "new": after, "by": by}
        if agent is not None:
            facts["agent"] = agent
        if record_once(settings, identity, "policy_changed", "applied", **facts):
            written += 1
    return written
