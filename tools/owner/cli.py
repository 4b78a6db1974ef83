"""``macula-mcp owner show|set|preset``: the owner's capability switches at a terminal.

Light (no MCP SDK). A change is written whole to ``$MACULA_HOME/owner.toml``
(``tools.owner.store``); every running session notices it within ``POLL_S`` and tells its client
(``notifications/tools/list_changed``): no restart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from macula.config import AGENT_ENV
from tools.commands import parser_for
from tools.owner.policy import Switches
from tools.owner.presets import GROUP_TOOLS, PRESETS
from tools.owner.store import OwnerFileError, load, policy_path, set_preset, set_switch
from tools.settings import SocketSetupError, home_dir


def _parser() -> argparse.ArgumentParser:
    parser = parser_for("owner")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    show = verbs.add_parser("show", help="the effective switches (and the file's problem)")
    show.add_argument("--json", action="store_true", help="one JSON object")
    turn = verbs.add_parser("set", help="turn a group or a tool on (1) or off (0)")
    turn.add_argument("name", help=f"a tool (mesh_*) or a group ({', '.join(GROUP_TOOLS)})")
    turn.add_argument("value", choices=["0", "1"], help="0 off, 1 on")
    preset = verbs.add_parser("preset", help="start over from a preset")
    preset.add_argument("preset", choices=list(PRESETS), help="full, talk or read-only")
    for sub in (show, turn, preset):
        sub.add_argument("--agent", metavar="NAME", help=f"the agent's own table ({AGENT_ENV})")
    return parser


def render(switches: Switches, path: Path) -> str:
    """``owner show``: the file, the preset, any problem, then each group's tools."""
    lines = [f"file: {path}", f"preset: {switches.preset}"]
    if switches.agent:
        lines.append(f"agent: {switches.agent}")
    if switches.problem is not None:
        lines.append(f"MALFORMED: {switches.problem.text()}")
        lines.append("every switchable tool is off until the file is fixed")
    for group, tools in GROUP_TOOLS.items():
        on = sum(switches.on[t] for t in tools)
        lines.append(f"{group} ({on}/{len(tools)} on)")
        for tool in tools:
            state = "on " if switches.on[tool] else "off"
            lines.append(f"  {state} {tool:<28} {switches.decided_by[tool]}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    environ = dict(os.environ if env is None else env)
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        path = policy_path(home_dir(environ))
    except SocketSetupError as exc:
        print(f"macula-mcp owner: {exc}", file=sys.stderr)
        return 2
    try:
        if args.verb == "set":
            switches = set_switch(path, args.name, int(args.value), args.agent)
        elif args.verb == "preset":
            switches = set_preset(path, args.preset, args.agent)
        else:
            switches = load(path).switches(args.agent)
    except (OwnerFileError, OSError) as exc:
        print(f"macula-mcp owner: {exc}", file=sys.stderr)
        return 2
    if args.verb == "show" and args.json:
        print(json.dumps({"file": str(path)} | switches.view()))
    elif args.verb == "show":
        print(render(switches, path))
    else:
        off = len([v for v in switches.on.values() if not v])
        print(
            f"written {path}: {len(switches.on) - off} tools on, {off} off "
            "(running sessions pick it up without a restart)"
        )
    if switches.problem is not None:
        print(f"macula-mcp owner: {switches.problem.text()}", file=sys.stderr)
        return 1
    return 0
