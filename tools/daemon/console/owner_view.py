"""The owner's capability switches at the console: read them, flip one, choose a preset.

Invariants:
- the console is the owner (a person with the home's token); what it writes goes through
  ``tools.owner.store`` as the CLI's does (checked first, written whole, 0600, comments kept,
  said to the audit trail with ``by="console"``), so every attached session is told
  (``notifications/tools/list_changed``) by its own watcher;
- a malformed file is shown (file, line, key) and not edited: the person fixes it by hand;
- the body is checked here (``ActionError``: HTTP 400, nothing written): ``{"name", "value"
  0|1}`` or ``{"preset"}``, each with an optional ``agent``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tools.daemon.console.actions import ActionError
from tools.owner.policy import AGENT_NAME, Policy
from tools.owner.presets import GROUP_TOOLS, PRESETS
from tools.owner.store import OwnerFileError, load, policy_path, set_preset, set_switch


def _agent(raw: object) -> str | None:
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or not AGENT_NAME.fullmatch(raw):
        raise ActionError("invalid_argument", "agent: 1-64 letters, digits, '-' or '_'")
    return raw


def view(home: Path, agent: object = None) -> dict[str, Any]:
    """The switches of the home (or of ``agent``), the agents the file names, the catalog."""
    path = policy_path(home)
    loaded = load(path)
    named = sorted(loaded.found.agents) if isinstance(loaded.found, Policy) else []
    switches = loaded.switches(_agent(agent))
    return {
        "file": str(path),
        "exists": int(loaded.data is not None),
        "agents": named,
        "presets": list(PRESETS),
        "groups": {group: list(tools) for group, tools in GROUP_TOOLS.items()},
        "switches": switches.view() | {"decided_by": dict(switches.decided_by)},
    }


def _change(home: Path, body: dict[str, Any]) -> dict[str, Any]:
    agent = _agent(body.get("agent"))
    path = policy_path(home)
    try:
        if "preset" in body:
            preset = body["preset"]
            if not isinstance(preset, str):
                raise ActionError("invalid_argument", f"preset: one of {', '.join(PRESETS)}")
            set_preset(path, preset, agent, by="console")
        else:
            name, value = body.get("name"), body.get("value")
            if not isinstance(name, str):
                raise ActionError("invalid_argument", "name: a tool (mesh_*) or a group")
            if isinstance(value, bool) or value not in (0, 1):
                raise ActionError("invalid_argument", "value: 0 (off) or 1 (on)")
            set_switch(path, name, int(value), agent, by="console")
    except OwnerFileError as exc:
        raise ActionError("invalid_argument", str(exc)) from None
    return view(home, agent)


async def change(home: Path, body: dict[str, Any]) -> dict[str, Any]:
    """One change the person asked for; the switches after it."""
    return await asyncio.to_thread(_change, home, body)
