"""``macula-mcp approvals list|approve|deny``: the owner decides what waits (issue 39).

Invariants:
- works whether the daemon runs or not: a decision is written to the agent's approval store
  (``approvals.sqlite3``, SQLite, shared safely between processes); a running agent notices it
  within ``macula.agent.approvals.POLL_S`` (it polls while items are pending), a stopped one
  applies it when it starts. An item past its TTL cannot be approved (``expired``).
- ``list`` shows the content: this is the owner's terminal, not the model's.
- ``--agent NAME`` limits it to that agent (``$MACULA_HOME/agents/NAME.key``); without it every
  agent of this home is looked at. A key file is only read here, never created.
- exit status: 0 done, 1 refused (not found, already decided, expired), 2 bad usage.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from macula.agent.approvals import OWNER_FILE_NAME, load_settings
from macula.config import AGENT_ENV, RINGS_DB_ENV, macula_home, path_setting
from macula.errors import ConfigError
from macula.keyfile import load_identity
from macula.store.approvals import ApprovalError, ApprovalStore, Item
from tools.commands import parser_for

STORE_NAME = "approvals.sqlite3"


def store_paths(env: Mapping[str, str], agent: str | None) -> list[Path]:
    """The approval stores to look at: the named agent's, or every agent's of this home."""
    home = macula_home(env)
    moved = path_setting(env, RINGS_DB_ENV, "a database file path")
    if moved is not None:
        return [moved.with_name(STORE_NAME)]
    if agent is not None:
        key = home / "agents" / f"{agent}.key"
        if not key.is_file():
            raise ConfigError(f"--agent {agent}: no such agent here ({key} does not exist)")
        node_id = load_identity(key).node_id
        return [home / "agents" / node_id.hex()[:16] / STORE_NAME]
    return sorted((home / "agents").glob(f"*/{STORE_NAME}"))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def approvals_check(env: Mapping[str, str]) -> tuple[str, bool | None, str] | None:
    """``doctor``: the ``[approvals]`` settings of ``owner.toml`` as the agent reads them
    (None without the file); a malformed table FAILs naming the file and the key (the agent
    then holds everything)."""
    try:
        path = macula_home(env) / OWNER_FILE_NAME
    except ConfigError:
        return None  # the settings check names the variable
    if not path.exists():
        return None
    settings = load_settings(path, env.get(AGENT_ENV) or None)
    if settings.error is not None:
        return (
            "owner approvals",
            False,
            (
                f"{settings.error}: fails closed (every task from a stranger and every ring under "
                "ask waits for you); fix the file"
            ),
        )
    return (
        "owner approvals",
        True,
        (
            f"tasks_from_strangers {settings.tasks_from_strangers}, rings_when_asked "
            f"{settings.rings_when_asked}, ttl_s {settings.ttl_s}, "
            f"max_pending {settings.max_pending}"
        ),
    )


def owner_view(item: Item, now: int) -> dict[str, Any]:
    """What the owner sees of an item: its metadata and its content."""
    return item.metadata(now) | {
        "owner": item.owner.hex(),
        "ref": item.ref,
        "content": item.content,
    }


async def pending_in(paths: list[Path], now: int) -> list[dict[str, Any]]:
    """The pending items of the stores at ``paths`` (a missing file holds none)."""
    shown: list[dict[str, Any]] = []
    for path in paths:
        if not path.exists():
            continue
        async with await ApprovalStore.open(path) as store:
            shown += [owner_view(i, now) for i in await store.pending(None, now, limit=1000)]
    return shown


async def decide_in(
    paths: list[Path], approval_id: str, decision: str, reason: str | None, *, by: str
) -> Item:
    """Record the owner's decision in whichever store holds ``approval_id``."""
    for path in paths:
        if not path.exists():
            continue
        async with await ApprovalStore.open(path) as store:
            if await store.get(approval_id) is not None:
                return await store.decide(approval_id, decision, _now_ms(), by=by, reason=reason)
    raise ApprovalError(
        "not_found", f"no approval item {approval_id}", "macula-mcp approvals list shows them"
    )


def _print_item(item: dict[str, Any]) -> None:
    who = item["petname"] or item["sender"][:16]
    print(
        f"{item['approval_id']}  {item['kind']:<4}  from {who} ({item['sender'][:16]}…)  "
        f"{item['size']} B  {item['age_s']} s ago  expires in {item['expires_in_s']} s"
    )
    print("    " + json.dumps(item["content"], ensure_ascii=False)[:2000])


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    environ = os.environ if env is None else env
    parser = parser_for("approvals")
    parser.add_argument("action", choices=("list", "approve", "deny"))
    parser.add_argument("approval_id", nargs="?", help="the item's id (approve, deny)")
    parser.add_argument("--agent", help="only this agent (its name, as in register --agent)")
    parser.add_argument("--reason", help="deny: a reason the sender reads (after 'refused:')")
    parser.add_argument("--json", action="store_true", help="list: JSON, one object per item")
    args = parser.parse_args(list(argv))
    if args.action != "list" and not args.approval_id:
        parser.error(f"{args.action} needs the item's id (macula-mcp approvals list shows it)")
    try:
        paths = store_paths(environ, args.agent or None)
        agent = args.agent or environ.get(AGENT_ENV)
        settings = load_settings(macula_home(environ) / OWNER_FILE_NAME, agent)
        if settings.error:
            print(f"warning: {settings.error} (approvals fail closed)", file=sys.stderr)
        if args.action == "list":
            items = asyncio.run(pending_in(paths, _now_ms()))
            for item in items:
                print(json.dumps(item, ensure_ascii=False)) if args.json else _print_item(item)
            if not items and not args.json:
                print("nothing waits for your approval")
            return 0
        decision = "approved" if args.action == "approve" else "denied"
        decided = asyncio.run(
            decide_in(paths, args.approval_id, decision, args.reason, by="owner (cli)")
        )
    except ConfigError as exc:
        print(f"macula-mcp approvals: {exc}", file=sys.stderr)
        return 2
    except ApprovalError as exc:
        print(
            f"macula-mcp approvals: {exc.code}: {exc.detail} ({exc.next_action})", file=sys.stderr
        )
        return 1
    print(f"{decided.approval_id} {decided.state}: the agent applies it (at once if it runs)")
    return 0
