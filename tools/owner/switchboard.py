"""The owner's switches inside one MCP server (one session): what ``tools/list`` shows, what a
call may run, and the ``notifications/tools/list_changed`` a change sends.

Invariants:
- ``tools/list`` and every ``tools/call`` read the switches afresh (``PolicySource.current``): a
  client holding an old list that calls a tool now off gets ``capability_disabled`` (naming the
  switch; only the owner can change it), never the tool;
- a change is noticed by a watcher in the server's lifespan (every ``POLL_S``), whoever made it,
  and announced once per change: to the session (2025 era, after its handshake) as
  ``notifications/tools/list_changed``, and on the server's subscription bus (2026 era:
  ``subscriptions/listen`` streams);
- the server declares ``tools.listChanged`` (the 2026 era derives it from ``subscriptions/listen``
  being served, as the SDK does);
- nothing here writes the file: no tool can change the policy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, cast

import anyio
from mcp.server.lowlevel.server import NotificationOptions
from mcp.shared.subscriptions import ToolsListChanged
from mcp_types import CallToolResult, ServerNotification, ToolListChangedNotification
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from macula.config import AGENT_ENV
from tools.owner.policy import Switches
from tools.owner.store import policy_path
from tools.owner.watch import POLL_S, PolicySource
from tools.server.results import fail
from tools.settings import SocketSetupError, home_dir

log = logging.getLogger("macula.tools.owner")

SEND_TIMEOUT_S: Final = 5.0
DISABLED: Final = "capability_disabled"


def disabled(tool: str, switches: Switches) -> CallToolResult:
    """The refusal of a call to a tool the owner turned off."""
    switch = switches.switch_of(tool)
    if switches.problem is not None:
        why = f"{switches.problem.text()}: every switchable tool is off until it is fixed"
        action = (
            "only the owner can fix owner.toml (by hand, or at the console); `uv run "
            "macula-mcp owner show` names the problem; use the tools that are listed"
        )
    else:
        agent = f" --agent {switches.agent}" if switch.startswith("agents.") else ""
        why = f"the owner turned {tool} off (switch {switch} in owner.toml)"
        action = (
            "only the owner can change this, at the console or with `uv run macula-mcp "
            f"owner set {tool} 1{agent}`; use the tools that are listed (tools/list)"
        )
    return fail(DISABLED, f"{tool}: {why}", retryable=False, next_action=action, switch=switch)


class Switchboard:
    """One server's view of the owner's switches (``source``) and the session to tell."""

    def __init__(self, source: PolicySource) -> None:
        self.source = source
        self.session: Any = None  # the 2025-era session, once its handshake is done
        self.announced = source.generation

    def current(self) -> Switches:
        return self.source.current()

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        """Server middleware: remember the session to notify, once it is ready (2025 era)."""
        result = await call_next(ctx)
        ready = ctx.method == "notifications/initialized" or (
            ctx.request_id is not None and ctx.method != "initialize"
        )
        era = getattr(ctx, "protocol_version", None)
        if ready and self.session is None and era not in MODERN_PROTOCOL_VERSIONS:
            self.session = ctx.session
        return result

    async def announce(self, bus: Any) -> None:
        """Tell this server's clients that the tool list changed."""
        self.announced = self.source.generation
        session = self.session
        if session is not None:
            try:
                with anyio.fail_after(SEND_TIMEOUT_S):
                    note = ToolListChangedNotification()
                    await session.send_notification(cast(ServerNotification, note))
            except Exception as exc:  # a closed or stuck session: nothing else to tell
                log.info("tools/list_changed was not delivered: %r", exc)
        await bus.publish(ToolsListChanged())

    async def watch(self, bus: Any, interval: float = POLL_S) -> None:
        """Check the file every ``interval`` seconds, for the server's lifespan."""
        while True:
            self.source.check()
            if self.source.generation != self.announced:
                await self.announce(bus)
            await anyio.sleep(interval)


def switchboard_for(env: Mapping[str, str]) -> Switchboard:
    """The switchboard of a server started with ``env``: its home's ``owner.toml``, the
    switches of agent ``MACULA_MCP_AGENT`` (none: the home's alone)."""
    try:
        path = policy_path(home_dir(env))
    except SocketSetupError:  # a bad MACULA_HOME: every tool answers that problem anyway
        path = Path("/nonexistent") / "owner.toml"
    return Switchboard(PolicySource(path, env.get(AGENT_ENV) or None))


def declare_list_changed(app: Any) -> None:
    """Make ``app`` (an ``MCPServer``) declare ``tools.listChanged`` in the 2025 era."""
    lowlevel = app._lowlevel_server
    original = lowlevel.get_capabilities

    def get_capabilities(notification_options: Any = None, *args: Any, **kwargs: Any) -> Any:
        given = notification_options or NotificationOptions()
        options = NotificationOptions(given.prompts_changed, given.resources_changed, True)
        return original(options, *args, **kwargs)

    lowlevel.get_capabilities = get_capabilities
