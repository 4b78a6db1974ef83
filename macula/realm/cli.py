"""``macula-realm``: the command line of a realm's owner.

    macula-realm create NAME              # authority key (0600) under $MACULA_HOME/realms/NAME/
    macula-realm serve --station ID@HOST:PORT   # the join service; publishes the realm's records
    macula-realm pending                  # join requests waiting for a decision
    macula-realm approve CODE | deny CODE # CODE as shown (ABCD-EFGH) or the whole link
    macula-realm endorse-station STATION_ID --out FILE   # a station may carry the realm
    macula-realm revoke NODE_ID           # a member, or a station endorsed with endorse-station
    macula-realm members

``--realm NAME`` picks the realm when this home owns several. ``--json`` prints one JSON object.
Exit codes: 0 done; 1 refused (``code`` says why: unknown_code, decided, expired, not_member...);
2 bad usage or configuration; 3 rate_limited (too many wrong codes); 4 the mesh is unreachable.
Invariant: a code is printed only by ``pending`` (to the realm's owner), never logged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from macula.clock import now_ms
from macula.config import DEFAULT_HOME, HOME_ENV, macula_home
from macula.errors import ConfigError, MaculaError
from macula.help_format import HelpFormatter
from macula.keyfile import KeyFileError
from macula.node.node import Node
from macula.private_file import write_private
from macula.realm.authority import (
    DEFAULT_MAX_PENDING,
    DEFAULT_SESSION_TTL_MS,
    Realm,
    RealmError,
    list_realms,
)
from macula.realm.codes import DEFAULT_MAX_WRONG, DEFAULT_WINDOW_MS, GuessLimiter, display
from macula.realm.records import DEFAULT_ROLE, DEFAULT_VALID_MS, join_procedure
from macula.realm.service import DEFAULT_PUBLISH_EVERY_S, JoinService
from macula.stations import parse_station
from macula.wire import cbor

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_RATE_LIMITED, EXIT_UNREACHABLE = 0, 1, 2, 3, 4


DESCRIPTION = """The command line of a realm's owner: create a realm (its authority key), run its
join service on a station, approve or deny join requests, endorse stations, revoke members.
Exit codes: 0 done; 1 refused (the code says why); 2 bad usage or configuration; 3 too many
wrong codes (wait); 4 the mesh is unreachable."""

EPILOG = """
examples:
  macula-realm create team
  macula-realm --realm team serve --station NODE_ID@HOST:4433
  macula-realm pending
  macula-realm approve ABCD-EFGH
"""

SUBCOMMANDS = (  # name, one line, example
    ("create", "create a realm and its authority key (0600, in this home)", "create team"),
    (
        "serve",
        "run the realm's join service on a station and publish the realm's records",
        "--realm team serve --station NODE_ID@HOST:4433",
    ),
    ("pending", "list the join requests waiting for a decision, with their codes", "pending"),
    ("approve", "approve a join request by its code", "approve ABCD-EFGH --role member"),
    ("deny", "deny a join request by its code", "deny ABCD-EFGH"),
    (
        "endorse-station",
        "let a station carry this realm over its links (a signed station endorsement)",
        "endorse-station STATION_ID --out team.endorsement",
    ),
    ("revoke", "revoke a member or an endorsed station (a signed revocation)", "revoke NODE_ID"),
    ("members", "list the members, with role and validity", "members --json"),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="macula-realm", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--realm", help="which realm of this home (default: the only one)")
    parser.add_argument(
        "--home", help=f"this home folder (default: ${HOME_ENV}, else {DEFAULT_HOME})"
    )
    parser.add_argument(
        "--max-wrong-codes",
        type=int,
        default=DEFAULT_MAX_WRONG,
        help="wrong codes per window before approve/deny wait",
    )
    parser.add_argument(
        "--wrong-code-window-s",
        type=float,
        default=DEFAULT_WINDOW_MS / 1000,
        help="the window of --max-wrong-codes, in seconds",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary, example in SUBCOMMANDS:
        sub.add_parser(
            name,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}.",
            epilog=f"example:\n  macula-realm {example}",
            formatter_class=HelpFormatter,
        )
    _subcommand_flags(sub.choices)
    return parser


def _subcommand_flags(commands: dict[str, argparse.ArgumentParser]) -> None:
    commands["create"].add_argument("name", help="the realm's name")
    valid_days = DEFAULT_VALID_MS / 86_400_000
    for verb in ("approve", "deny"):
        commands[verb].add_argument("code", help="ABCD-EFGH, or the macula-realm:// link")
    commands["approve"].add_argument("--role", default=DEFAULT_ROLE, help="the member's role")
    for name in ("approve", "endorse-station"):
        commands[name].add_argument(
            "--valid-days", type=float, default=valid_days, help="how long it is valid"
        )
    station = commands["endorse-station"]
    station.add_argument("station_id", help="the station's node id, 64 hex")
    station.add_argument(
        "--out", type=Path, help="write the record here for macula-relay --realm-endorsement"
    )
    commands["revoke"].add_argument("node_id", help="the member's or station's node id, 64 hex")
    serve = commands["serve"]
    serve.add_argument(
        "--station", required=True, help="the station to serve on: NODE_ID@HOST:PORT or HOST:PORT"
    )
    serve.add_argument(
        "--session-ttl-s",
        type=float,
        default=DEFAULT_SESSION_TTL_MS / 1000,
        help="seconds a join request waits for a decision",
    )
    serve.add_argument(
        "--max-pending",
        type=int,
        default=DEFAULT_MAX_PENDING,
        help="join requests waiting at once",
    )
    serve.add_argument(
        "--publish-every-s",
        type=float,
        default=DEFAULT_PUBLISH_EVERY_S,
        help="seconds within which a newly signed record reaches the DHT",
    )


def _when(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


class _Out:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def done(self, result: dict[str, Any], text: str) -> int:
        print(json.dumps({"ok": 1, **result}) if self.as_json else text, flush=True)
        return EXIT_OK

    def fail(self, code: str, detail: str, exit_code: int) -> int:
        if self.as_json:
            print(json.dumps({"ok": 0, "code": code, "detail": detail}), flush=True)
        else:
            print(f"macula-realm: {code}: {detail}", file=sys.stderr, flush=True)
        return exit_code


def _code_of(text: str) -> str:
    if text.startswith("macula-realm://"):
        return parse_qs(urlparse(text).query).get("code", [""])[0]
    return text


def _realm(args: argparse.Namespace, home: Path) -> Realm:
    name = args.realm
    if name is None:
        owned = list_realms(home)
        if len(owned) != 1:
            which = ", ".join(owned) or "none"
            raise RealmError("which_realm", f"give --realm NAME (this home owns: {which})")
        name = owned[0]
    limiter = GuessLimiter(args.max_wrong_codes, int(args.wrong_code_window_s * 1000))
    extra: dict[str, Any] = {}
    if args.command == "serve":
        extra = {"session_ttl_ms": int(args.session_ttl_s * 1000), "max_pending": args.max_pending}
    return Realm(home, name, limiter=limiter, **extra)


def _run(args: argparse.Namespace, out: _Out) -> int:
    home = Path(args.home).expanduser().absolute() if args.home else macula_home()
    now = now_ms()
    if args.command == "create":
        realm = Realm(home, args.name)
        identity = realm.create()
        key = identity.node_id.hex()
        return out.done(
            {"realm": args.name, "authority": key, "folder": str(realm.folder)},
            f"created realm {args.name}\nauthority {key}\nkey file {realm.key_path} (0600)\n"
            f"next: macula-realm --realm {args.name} serve --station NODE_ID@HOST:PORT\n"
            f"stations protect it with: macula-relay --realm {args.name}={key}",
        )
    realm = _realm(args, home).open()
    if args.command == "pending":
        rows: list[dict[str, Any]] = [
            {
                "code": display(s.code),
                "node": s.node.hex(),
                "requested_at": s.created_at,
                "expires_at": s.expires_at,
            }
            for s in realm.pending(now)
        ]
        lines = [f"{r['code']}  {r['node']}  expires {_when(r['expires_at'])}" for r in rows]
        return out.done(
            {"realm": realm.name, "pending": rows}, "\n".join(lines) or "no join request is waiting"
        )
    if args.command in ("approve", "deny"):
        extra = {}
        if args.command == "approve":
            extra = {"role": args.role, "valid_ms": int(args.valid_days * 86_400_000)}
        session = realm.decide(_code_of(args.code), args.command == "approve", now, **extra)
        return out.done(
            {"realm": realm.name, "node": session.node.hex(), "status": session.status},
            f"{session.status}: {session.node.hex()} in realm {realm.name}",
        )
    if args.command == "endorse-station":
        return _endorse_station(realm, args, out, now)
    if args.command == "revoke":
        node = _node_id(args.node_id)
        realm.revoke(node, now)
        return out.done(
            {"realm": realm.name, "node": node.hex(), "status": "revoked"},
            f"revoked {node.hex()} in realm {realm.name} (published by serve)",
        )
    if args.command == "members":
        members: list[dict[str, Any]] = [
            {
                "node": m.node.hex(),
                "role": m.role,
                "joined_at": m.joined_at,
                "valid_until": m.valid_until,
                "revoked": int(m.revoked_at is not None),
            }
            for m in realm.members()
        ]
        lines = [
            f"{r['node']}  {r['role']}  until {_when(r['valid_until'])}"
            + ("  REVOKED" if r["revoked"] else "")
            for r in members
        ]
        return out.done({"realm": realm.name, "members": members}, "\n".join(lines) or "no members")
    return _serve(realm, args, out)


def _node_id(text: str) -> bytes:
    try:
        node = bytes.fromhex(text)
    except ValueError:
        node = b""
    if len(node) != 32:
        raise RealmError("bad_node_id", "NODE_ID is 64 hex characters")
    return node


def _endorse_station(realm: Realm, args: argparse.Namespace, out: _Out, now: int) -> int:
    station = _node_id(args.station_id)
    valid_until = now + int(args.valid_days * 86_400_000)
    record = realm.endorse_station(station, valid_until, now)
    result: dict[str, Any] = {
        "realm": realm.name,
        "station": station.hex(),
        "role": "station",
        "valid_until": valid_until,
    }
    text = f"endorsed station {station.hex()} for realm {realm.name} until {_when(valid_until)}"
    if args.out is not None:
        write_private(args.out, cbor.encode(record.to_rpc()), parents=False)
        result["file"] = str(args.out)
        text += f"\nwrote {args.out}; run the station with: macula-relay "
        text += f"--realm {realm.name}={realm.authority.node_id.hex()} --realm-endorsement FILE"
    return out.done(result, text + "\n(published to the DHT by serve; revoke with revoke ID)")


def _serve(realm: Realm, args: argparse.Namespace, out: _Out) -> int:
    station = parse_station(args.station)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        async with Node(realm.authority, [station]) as node:
            service = JoinService(realm, node, publish_every_s=args.publish_every_s)
            await service.start()
            out.done(
                {
                    "realm": realm.name,
                    "authority": realm.authority.node_id.hex(),
                    "station": str(station),
                    "procedure": join_procedure(realm.name),
                    "serving": 1,
                },
                f"serving realm {realm.name} on {station} ({join_procedure(realm.name)})",
            )
            task = asyncio.create_task(service.run(stop))
            await stop.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return EXIT_OK

    return asyncio.run(main())


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = _Out(args.json)
    try:
        return _run(args, out)
    except RealmError as exc:
        exit_code = EXIT_RATE_LIMITED if exc.code == "rate_limited" else EXIT_REFUSED
        if exc.code in ("which_realm", "bad_name", "no_realm", "bad_node_id"):
            exit_code = EXIT_USAGE
        return out.fail(exc.code, exc.detail, exit_code)
    except (ConfigError, KeyFileError) as exc:
        return out.fail("configuration", str(exc), EXIT_USAGE)
    except (MaculaError, OSError) as exc:
        return out.fail("unreachable", str(exc), EXIT_UNREACHABLE)


if __name__ == "__main__":
    sys.exit(main())
