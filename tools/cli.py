"""``macula-mcp``: the MCP server over stdio, plus ``mcp-config``, ``doctor``, ``demo``, and
the commands of other modules (``register``/``uninstall`` in tools/harness/register.py, ``station``,
``daemon``, ``console``, ``http-token``, ``guard``, ``owner``); ``tools.commands`` says what
each does.

stdout carries MCP protocol only; every log line goes to stderr. Closing stdin ends the session
gracefully (goodbye published, stores closed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from macula.config import STATIONS_ENV
from macula.errors import MaculaError
from macula.logformat import KeyValueFormatter
from macula.quic.event_loop import run as run_loop
from macula.stations import StationAddress
from tools.commands import parser_for, top_parser
from tools.launch import server_command
from tools.settings import log_level


def _logging(level: str = "WARNING") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    logging.basicConfig(level=log_level(os.environ, level), handlers=[handler], force=True)
    logging.getLogger("quic").setLevel(logging.WARNING)


def serve() -> None:
    from tools.stdio import front as stdio_front

    front = stdio_front.running() or stdio_front.start(os.environ)  # answers the opening now
    from tools.server.runtime_gate import startup_problem
    from tools.server.server import build_server
    from tools.stdio.fronted import serve_behind

    _logging()
    problem = startup_problem(os.environ)  # said on stderr, answered by every tool, exit 2
    try:
        run_loop(serve_behind(build_server(problem=problem), front))  # deep requests answered
    except* MaculaError as group:  # raised later, inside the server's task groups
        _fatal(group.exceptions[0])
    except* KeyboardInterrupt:
        pass
    if problem is not None:
        raise SystemExit(2)


def _fatal(exc: BaseException) -> NoReturn:
    print(f"macula-mcp: {exc}", file=sys.stderr)
    raise SystemExit(2) from None


def mcp_config(attach: bool = False) -> None:
    command = [*server_command(), *(["attach"] if attach else [])]
    entry: dict[str, Any] = {"command": command[0], "args": command[1:]}
    stations = os.environ.get(STATIONS_ENV)
    if stations:
        from macula.config import configured_stations

        try:
            configured_stations(os.environ)  # never print an entry macula-mcp would refuse
        except MaculaError as exc:
            _fatal(exc)
        entry["env"] = {STATIONS_ENV: stations}
    print(json.dumps({"mcpServers": {"macula": entry}}, indent=2))


Check = tuple[str, bool | None, str]  # name, passed (None: a warning, not a failure), detail


async def _doctor() -> list[Check]:
    from macula.config import identity_path
    from macula.keyfile import load_or_create_identity
    from tools.doctor_checks import configuration_check, owner_check, settings_checks

    results: list[Check] = []
    env = dict(os.environ)
    try:
        path = identity_path(env)
        identity = load_or_create_identity(path)
        results.append(("identity", True, f"{identity.node_id.hex()} ({path})"))
    except Exception as exc:
        results.append(("identity", False, str(exc)))
    configuration, stations = await configuration_check(env)
    results.append(configuration)
    results.extend(settings_checks(env))
    results.append(owner_check(env))
    station_checks = [await _station_check(env, station) for station in stations]
    results.extend(station_checks)
    reachable = any(good is not False for _, good, _ in station_checks)
    from tools.doctor_checks import first_answer_check, local_station_check

    if not env.get(STATIONS_ENV):
        results.append(local_station_check(env))
    results.append(await asyncio.to_thread(first_answer_check, env))
    command = server_command()
    if not reachable:  # a fresh server would spend its whole connect budget failing
        results.append(("MCP round trip", None, "not tried: no configured station is reachable"))
    else:
        results.append(await _round_trip(env, command))
    from tools.harness.register import registration_checks

    results.extend(registration_checks(env, sys.platform))
    return results


async def _round_trip(env: dict[str, str], command: list[str]) -> Check:
    """A fresh ``macula-mcp`` started as a harness starts it lists its tools."""
    from mcp import Client, StdioServerParameters

    try:
        params = StdioServerParameters(command=command[0], args=command[1:], env=env)
        async with Client(params) as client:
            tools = await client.list_tools()
        listed = len(tools.tools)
        return "MCP round trip", listed > 0, f"{listed} tools listed by a fresh server"
    except Exception as exc:
        return "MCP round trip", False, f"{type(exc).__name__}: {exc}"


async def _station_check(env: dict[str, str], station: StationAddress) -> Check:
    """Reachable, and presenting the key it is pinned to (the default station: this home's;
    another's there is a warning: this home then uses its own local station)."""
    from macula.config import known_stations_from_env
    from tools.local_station.station import (
        ForeignStationError,
        own_default_station,
        own_station_keys,
        presented_key,
    )

    name = f"station {station}"
    configured = bool(env.get(STATIONS_ENV))
    try:
        if not configured:
            try:
                own = await own_default_station(env)
            except ForeignStationError as exc:
                return name, None, str(exc)
            if own is None:
                return name, True, "nothing there (this home uses its own local station)"
            ours = own.node_id or b""
            where = own_station_keys(env)[ours]
            return name, True, f"QUIC handshake ok; key {ours.hex()} is this home's ({where})"
        known = known_stations_from_env(env)
        pin = known.pin(station).node_id
        key = await presented_key(station, timeout=3)
    except MaculaError as exc:
        return name, False, str(exc)
    if key is None:
        return name, False, "unreachable: no QUIC handshake within 3 s"
    if pin is None:
        return (
            name,
            True,
            f"QUIC handshake ok; key {key.hex()} (pinned on first use in {known.path})",
        )
    if key != pin:
        return name, False, f"presented key {key.hex() or 'none'}, but it is pinned to {pin.hex()}"
    return name, True, "QUIC handshake ok; key matches its pin"


def doctor() -> None:
    _logging("ERROR")
    results = asyncio.run(_doctor())
    for name, good, detail in results:
        print(f"[{'warn' if good is None else 'ok  ' if good else 'FAIL'}] {name}: {detail}")
    failed = [name for name, good, _ in results if good is False]
    print("all checks passed" if not failed else f"failed: {', '.join(failed)}")
    raise SystemExit(0 if not failed else 1)


def _no_flags(name: str, argv: Sequence[str]) -> None:
    """A command without flags still answers ``--help`` (and refuses what it does not take)."""
    parser_for(name).parse_args(list(argv))


def _run_serve(argv: Sequence[str]) -> None:
    _no_flags("serve", argv)
    serve()


def _run_mcp_config(argv: Sequence[str]) -> None:
    from tools.daemon.http.cli import main as http_cli
    from tools.daemon.http.cli import mcp_config_parser

    parser = mcp_config_parser()
    args = parser.parse_args(list(argv))
    if args.http:  # the daemon's /mcp (tools.harness.http_register)
        raise SystemExit(http_cli(["mcp-config", *argv]))
    if args.agent is not None or args.port is not None:
        parser.error("--agent and --port go with --http")
    mcp_config(attach=args.attach)


def _run_doctor(argv: Sequence[str]) -> None:
    _no_flags("doctor", argv)
    doctor()


def _run_demo(argv: Sequence[str]) -> None:
    _no_flags("demo", argv)
    from tools.demo import main as demo

    demo()


def _run_register(name: str) -> Callable[[Sequence[str]], None]:
    def run_it(argv: Sequence[str]) -> None:
        from tools.harness.register import run

        raise SystemExit(run(name, argv))

    return run_it


def _run_http_token(argv: Sequence[str]) -> None:
    from tools.daemon.http.cli import (
        main as http_cli,  # the daemon's /mcp (tools.harness.http_register)
    )

    raise SystemExit(http_cli(["http-token", *argv]))


def _run_a2a_token(argv: Sequence[str]) -> None:
    from tools.a2a.token_command import main as a2a_cli  # the daemon's A2A door (tools.a2a.door)

    raise SystemExit(a2a_cli(argv))


def _run_station(argv: Sequence[str]) -> None:
    from tools.local_station.command import main as station

    station(argv)


def _run_guard(argv: Sequence[str]) -> None:
    from tools.guard.command import main as guard

    guard(argv)


def _run_daemon(argv: Sequence[str]) -> None:
    from tools.daemon.command import main as daemon

    daemon(argv)


def _run_console(argv: Sequence[str]) -> None:
    from tools.daemon.console.command import main as console

    console(argv)


def _run_owner(argv: Sequence[str]) -> None:
    from tools.owner.cli import main as owner

    raise SystemExit(owner(argv))


def _run_a2a_agent(argv: Sequence[str]) -> None:
    from tools.a2a.agent_command import main as a2a_agent

    a2a_agent(argv)


def _run_audit(argv: Sequence[str]) -> None:
    from tools.owner.audit_cli import main as audit

    audit(argv)


def _run_approvals(argv: Sequence[str]) -> None:
    from tools.owner.approvals import main as approvals

    raise SystemExit(approvals(argv))


def _run_attach(argv: Sequence[str]) -> None:  # (the entry point dispatches it earlier, unimported)
    if list(argv) in (["-h"], ["--help"]):
        parser_for("attach").parse_args(["--help"])
    from tools.daemon.attach import main as attach

    attach(argv)


HANDLERS: dict[str, Callable[[Sequence[str]], None]] = {
    "serve": _run_serve,
    "attach": _run_attach,
    "register": _run_register("register"),
    "uninstall": _run_register("uninstall"),
    "mcp-config": _run_mcp_config,
    "doctor": _run_doctor,
    "demo": _run_demo,
    "daemon": _run_daemon,
    "station": _run_station,
    "guard": _run_guard,
    "console": _run_console,
    "http-token": _run_http_token,
    "owner": _run_owner,
    "a2a-agent": _run_a2a_agent,
    "audit": _run_audit,
    "approvals": _run_approvals,
    "a2a-token": _run_a2a_token,
}


def main(argv: Sequence[str] | None = None) -> None:
    """``macula-mcp [COMMAND] [FLAGS]``: each command parses its own flags (``--help`` too)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments:
        serve()
        return
    handler = HANDLERS.get(arguments[0])
    if handler is None:  # --help, or not a command: argparse says so and exits
        top_parser().parse_args(arguments)
        top_parser().error(f"{arguments[0]!r} is not a command")
    handler(arguments[1:])


if __name__ == "__main__":
    main()
