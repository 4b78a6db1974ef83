"""``macula-mcp audit show|verify|export``: the owner reads and checks an agent's audit trail.

Which trail: ``--agent NAME`` (the key ``$MACULA_HOME/agents/NAME.key``), else the agent of
``MACULA_MCP_IDENTITY`` / ``MACULA_MCP_AGENT``, else the only trail of the home (with several,
they are listed and ``--agent`` or ``--node`` is asked for). Nothing here writes the trail.

Exit status: 0 done (``verify``: the chain is intact), 1 ``verify`` found a problem (edited,
removed, reordered, truncated, head_missing, checkpoint_missing: the first one is named), 2
bad usage, 3 no trail (none recorded yet, or no such agent).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from macula.agent.audit_verify import verify_trail
from macula.config import AGENT_ENV, IDENTITY_ENV, identity_path, macula_home
from macula.errors import ConfigError
from macula.keyfile import KeyFileError, load_identity
from macula.private_file import write_private
from macula.store.audit_log import canonical, entries

NO_TRAIL_EXIT = 3


class NoTrail(Exception):
    """No trail to read; the message says which and why."""


def parser() -> argparse.ArgumentParser:
    from tools.commands import parser_for

    top = parser_for("audit")
    sub = top.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, say in (
        ("show", "print the latest entries, one a line"),
        ("verify", "check the chain: name the first entry edited, removed or reordered"),
        ("export", "write every entry as JSON lines (stdout, or --out FILE, 0600)"),
    ):
        action = sub.add_parser(name, help=say, description=say[0].upper() + say[1:] + ".")
        action.add_argument("--agent", help="the agent named NAME in this home")
        action.add_argument("--node", help="the trail of this node id (hex, or a prefix)")
        if name == "show":
            action.add_argument("--limit", type=int, default=20, help="default: 20")
            action.add_argument("--kind", help="only entries of this kind")
            action.add_argument("--since-seq", type=int, default=1)
        if name == "export":
            action.add_argument("--out", type=Path, help="default: stdout")
    return top


def trail_dir(env: Mapping[str, str], agent: str | None, node: str | None) -> Path:
    """The folder of the trail asked for (see the module docstring)."""
    home = macula_home(env)
    base = home / "audit"
    if agent is not None or env.get(IDENTITY_ENV) or env.get(AGENT_ENV):
        chosen = dict(env) | ({AGENT_ENV: agent} if agent is not None else {})
        if agent is not None:
            chosen.pop(IDENTITY_ENV, None)
        try:
            key = identity_path(chosen)
            node_id = load_identity(key).node_id.hex()
        except (ConfigError, KeyFileError) as exc:
            raise NoTrail(str(exc)) from None
        return base / node_id
    held = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    if node is not None:
        held = [name for name in held if name.startswith(node.lower())]
    if len(held) == 1:
        return base / held[0]
    if not held:
        raise NoTrail(f"no audit trail in {base}" + (f" for node {node}" if node else ""))
    names = ", ".join(name[:16] for name in held)
    raise NoTrail(f"{len(held)} trails in {base}: give --agent NAME or --node ID ({names})")


def _when(ms: object) -> str:
    stamp = datetime.fromtimestamp(int(ms) / 1000, UTC) if isinstance(ms, int) else None
    return stamp.isoformat(timespec="milliseconds") if stamp else "?"


def show(directory: Path, limit: int, kind: str | None, since_seq: int) -> int:
    kept: list[dict[str, object]] = []
    for entry in entries(directory, max(since_seq, 1) - 1):
        if kind is None or entry.get("kind") == kind:
            kept = [*kept[-(max(limit, 1) - 1) :], entry] if limit > 1 else [entry]
    for entry in kept:
        facts = entry.get("facts") or {}
        said = " ".join(f"{k}={v}" for k, v in facts.items()) if isinstance(facts, dict) else ""
        print(f"{entry['seq']:>8} {_when(entry.get('at_ms'))} {entry.get('kind')} "
              f"{entry.get('outcome')} {said}")  # fmt: skip
    return 0


def verify(directory: Path) -> int:
    report = verify_trail(directory)
    if report.problem is None:
        span = f"seq {report.first_seq}..{report.last_seq}" if report.entries else "empty"
        anchored = f", anchored after seq {report.anchored_at}" if report.anchored_at else ""
        print(f"intact: {span}, {report.entries} entries, {report.checkpoints} checkpoints "
              f"signed by {report.node_id or '?'}{anchored}")  # fmt: skip
        for note in report.notes:
            print(f"note: {note}")
        return 0
    problem = report.problem
    where = f" ({problem.segment} line {problem.line})" if problem.segment else ""
    print(f"{problem.kind}: {problem.detail}{where}")
    if problem.seq is not None:
        print(f"first bad entry: seq {problem.seq}")
    return 1


def export(directory: Path, out: Path | None) -> int:
    data = b"".join(canonical(entry) + b"\n" for entry in entries(directory))
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        write_private(out, data, parents=False)
        lines = data.count(b"\n")
        print(f"wrote {lines} entries to {out}", file=sys.stderr)
    return 0


def main(argv: Sequence[str]) -> None:
    args = parser().parse_args(list(argv))
    try:
        directory = trail_dir(os.environ, args.agent, args.node)
        if not directory.is_dir():
            raise NoTrail(f"no audit trail recorded yet in {directory}")
    except (NoTrail, ConfigError) as exc:
        print(f"macula-mcp audit: {exc}", file=sys.stderr)
        raise SystemExit(NO_TRAIL_EXIT) from None
    if args.action == "show":
        raise SystemExit(show(directory, args.limit, args.kind, args.since_seq))
    if args.action == "verify":
        raise SystemExit(verify(directory))
    raise SystemExit(export(directory, args.out))
